package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Each annotation format has exactly one codec here: a parse function and a Marshal method, in the
// style of KCP's RemediationDataFromAnnotation and RemediationData.Marshal
// (sigs.k8s.io/cluster-api controlplane/kubeadm/reconcilers/kubeadmcontrolplane/remediation.go).
// The health checker and the remediators use nothing else to read or write these annotations.

// MarkRecordFromAnnotation parses the value of UnhealthyAnnotation.
func MarkRecordFromAnnotation(value string) (*MarkRecord, error) {
	rec := &MarkRecord{}
	if err := json.Unmarshal([]byte(value), rec); err != nil {
		return nil, fmt.Errorf("unmarshalling value %q of annotation %s: %w", value, UnhealthyAnnotation, err)
	}
	return rec, nil
}

// Marshal returns the value of UnhealthyAnnotation for this record.
func (r *MarkRecord) Marshal() (string, error) {
	if r.Reason == "" {
		return "", errors.New("marshalling the mark: reason must not be empty")
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("marshalling the mark: %w", err)
	}
	return string(b), nil
}

// RemediationRecordFromAnnotation parses the value of RemediationRecordAnnotation.
func RemediationRecordFromAnnotation(value string) (*RemediationRecord, error) {
	rec := &RemediationRecord{}
	if err := json.Unmarshal([]byte(value), rec); err != nil {
		return nil, fmt.Errorf("unmarshalling value %q of annotation %s: %w", value, RemediationRecordAnnotation, err)
	}
	if rec.Machine == "" {
		return nil, fmt.Errorf("value %q of annotation %s: machine must not be empty", value, RemediationRecordAnnotation)
	}
	return rec, nil
}

// Marshal returns the value of RemediationRecordAnnotation for this record.
func (r *RemediationRecord) Marshal() (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("marshalling the remediation record of Machine %s: %w", r.Machine, err)
	}
	return string(b), nil
}

// ControlPlaneLockFromAnnotation parses the value of ControlPlaneLockAnnotation.
func ControlPlaneLockFromAnnotation(value string) (*ControlPlaneLock, error) {
	l := &ControlPlaneLock{}
	if err := json.Unmarshal([]byte(value), l); err != nil {
		return nil, fmt.Errorf("unmarshalling value %q of annotation %s: %w", value, ControlPlaneLockAnnotation, err)
	}
	if l.MachineRemediation == "" {
		return nil, fmt.Errorf("value %q of annotation %s: machineRemediation must not be empty", value, ControlPlaneLockAnnotation)
	}
	return l, nil
}

// Marshal returns the value of ControlPlaneLockAnnotation for this lock.
func (l *ControlPlaneLock) Marshal() (string, error) {
	b, err := json.Marshal(l)
	if err != nil {
		return "", fmt.Errorf("marshalling the control-plane lock of %s: %w", l.MachineRemediation, err)
	}
	return string(b), nil
}
