package v1alpha1

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// LabelSelector returns the selector as a metav1.LabelSelector (to parse with
// metav1.LabelSelectorAsSelector).
func (s MachineSelector) LabelSelector() *metav1.LabelSelector {
	ls := &metav1.LabelSelector{}
	if s.MatchLabels != nil {
		ls.MatchLabels = make(map[string]string, len(s.MatchLabels))
		for k, v := range s.MatchLabels {
			ls.MatchLabels[k] = string(v)
		}
	}
	for _, e := range s.MatchExpressions {
		ls.MatchExpressions = append(ls.MatchExpressions, metav1.LabelSelectorRequirement{Key: e.Key, Operator: e.Operator, Values: e.Values})
	}
	return ls
}

// LabelValues converts a label map to MachineSelector.MatchLabels.
func LabelValues(labels map[string]string) map[string]LabelValue {
	out := make(map[string]LabelValue, len(labels))
	for k, v := range labels {
		out[k] = LabelValue(v)
	}
	return out
}

// MachineSelector is the health check's selector restricted to its cluster (the Machines it
// checks), parsed. Both the health checker and the remediators (the fencing of the health checks
// covering a Machine) select with it.
func (s *MachineHealthCheckSpec) MachineSelector() (labels.Selector, error) {
	ls := s.Selector.LabelSelector()
	if ls.MatchLabels == nil {
		ls.MatchLabels = map[string]string{}
	}
	ls.MatchLabels[clusterv1.ClusterNameLabel] = s.ClusterName
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, fmt.Errorf("invalid spec.selector: %w", err)
	}
	return sel, nil
}
