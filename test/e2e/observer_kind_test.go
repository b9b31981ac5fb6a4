//go:build kind

package e2e_test

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capr-io/capr/test/kind"
)

// The observer judges a run without CAPR's code: it reads the workload cluster's etcd from inside
// its etcd Pods (etcdctl, through docker and crictl on the nodes, so a broken API server path does
// not blind it), its Nodes through its API server, and the management cluster's Machines through a
// watch. None of it asks CAPR, or CAPI, whether the cluster is healthy.

// etcdView is one reading of the etcd cluster (test/kind).
type etcdView = kind.EtcdView

// etcdctl's flags inside a kubeadm etcd container: the health-check client's certificate, short
// timeouts so that one black-holed member costs a reading seconds, not minutes.
const etcdctlFlags = "--cacert=/etc/kubernetes/pki/etcd/ca.crt --cert=/etc/kubernetes/pki/etcd/healthcheck-client.crt " +
	"--key=/etc/kubernetes/pki/etcd/healthcheck-client.key --endpoints=https://127.0.0.1:2379 --dial-timeout=2s --command-timeout=3s"

// readEtcd asks the etcd of the first control-plane container of cluster that answers, other than
// avoid, for the member list, every member's health and status.
func readEtcd(cluster string, avoid map[string]bool) etcdView {
	v := etcdView{At: time.Now()}
	out, err := dockerOutput("ps", "--filter", "label=io.x-k8s.kind.cluster="+cluster, "--filter", "label=io.x-k8s.kind.role=control-plane", "--format", "{{.Names}}")
	if err != nil {
		v.Err = err.Error()
		return v
	}
	nodes := strings.Fields(out)
	sort.Strings(nodes)
	for _, node := range nodes {
		if avoid[node] {
			continue
		}
		script := fmt.Sprintf(`c=$(crictl ps -q --name '^etcd$' --state running | head -1); [ -n "$c" ] || exit 3
crictl exec "$c" etcdctl %[1]s member list -w json || exit 4; echo
crictl exec "$c" etcdctl %[1]s endpoint health --cluster -w json; echo
crictl exec "$c" etcdctl %[1]s endpoint status --cluster -w json; echo
crictl exec "$c" etcdctl %[1]s member list -w json; echo`, etcdctlFlags)
		// A reading begun just before its node is paused would otherwise wait, and the observer with it,
		// until the container is removed (on kind, 6 readings in 407 s once).
		out, err := dockerOutputWithin(20*time.Second, "exec", node, "timeout", "15", "sh", "-c", script)
		if err != nil && out == "" {
			v.Err = err.Error()
			continue
		}
		parsed, err := kind.ParseEtcdctl(out)
		if errors.Is(err, kind.ErrMembershipChanged) {
			v.Err, v.Changing, v.From = err.Error(), true, node
			return v
		}
		if errors.Is(err, kind.ErrMembershipUnconfirmed) {
			v.Unconfirmed = true
		}
		if err != nil {
			v.Err = err.Error()
			continue
		}
		parsed.At, parsed.From, parsed.Unconfirmed = v.At, node, v.Unconfirmed
		return parsed
	}
	return v
}

// machineEvent is a Machine seen created or deleting by the watch.
type machineEvent struct {
	At           time.Time
	Name         string
	ControlPlane bool
}

// observer samples etcd every second and watches the namespace's Machines from start to stop.
type observer struct {
	cluster, ns string
	avoid       map[string]bool
	start       time.Time

	mu       sync.Mutex
	views    []etcdView
	created  []machineEvent
	deleting map[string]time.Time
	done     chan struct{}
	wg       sync.WaitGroup
}

func startObserver(c client.WithWatch, ns, cluster string) *observer {
	o := &observer{cluster: cluster, ns: ns, avoid: map[string]bool{}, start: time.Now(), deleting: map[string]time.Time{}, done: make(chan struct{})}
	o.wg.Add(2)
	go func() {
		defer o.wg.Done()
		for {
			v := readEtcd(cluster, o.avoidSet())
			o.mu.Lock()
			o.views = append(o.views, v)
			o.mu.Unlock()
			select {
			case <-o.done:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	go func() {
		defer o.wg.Done()
		seen := map[string]bool{}
		for {
			w, err := c.Watch(ctx, &clusterv1.MachineList{}, client.InNamespace(ns))
			if err != nil {
				select {
				case <-o.done:
					return
				case <-time.After(time.Second):
					continue
				}
			}
			o.consume(w, seen)
			w.Stop()
			select {
			case <-o.done:
				return
			default:
			}
		}
	}()
	return o
}

func (o *observer) consume(w watch.Interface, seen map[string]bool) {
	for {
		select {
		case <-o.done:
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			m, isMachine := ev.Object.(*clusterv1.Machine)
			if !isMachine {
				continue
			}
			o.mu.Lock()
			if !seen[m.Name] {
				seen[m.Name] = true
				if m.CreationTimestamp.After(o.start) {
					_, cp := m.Labels[clusterv1.MachineControlPlaneLabel]
					o.created = append(o.created, machineEvent{At: m.CreationTimestamp.Time, Name: m.Name, ControlPlane: cp})
				}
			}
			if !m.DeletionTimestamp.IsZero() {
				if _, ok := o.deleting[m.Name]; !ok {
					o.deleting[m.Name] = m.DeletionTimestamp.Time
				}
			}
			o.mu.Unlock()
		}
	}
}

func (o *observer) avoidSet() map[string]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]bool{}
	for k := range o.avoid {
		out[k] = true
	}
	return out
}

// avoidNode keeps the observer from asking a node it cannot expect an answer from.
func (o *observer) avoidNode(node string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.avoid[node] = true
}

func (o *observer) stop() {
	close(o.done)
	o.wg.Wait()
}

// latest is the newest reading that some member answered.
func (o *observer) latest() (etcdView, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(o.views) - 1; i >= 0; i-- {
		if o.views[i].OK {
			return o.views[i], true
		}
	}
	return etcdView{}, false
}

// summary of a run, as the results file records it.
type summary struct {
	// MinMargin is the lowest failure margin read; SecondsAtMarginBelow1 how long it was below 1,
	// summed over consecutive readings (each counted from its time to the next reading's).
	MinMargin int `json:"minMargin"`
	// MinHealthyVoters is the fewest healthy voting members read.
	MinHealthyVoters      int     `json:"minHealthyVoters"`
	SecondsAtMarginBelow1 float64 `json:"secondsAtMarginBelow1"`
	// MinMarginSettled is MinMargin leaving out the readings in which the only voters that failed
	// the health check were joining: members of Machines created during the run that no reading had
	// yet seen healthy as voters. etcd promotes a learner once its log holds 90 % of the leader's
	// (readyPercentThreshold in etcd's server.go) and kubeadm promotes as soon as etcd allows, so a
	// replacement can vote before it has caught up: for those seconds a quorum needs every other
	// voter, whichever remediator scaled up. SecondsJoiningBelow1 is the part of
	// SecondsAtMarginBelow1 those readings account for.
	MinMarginSettled     int     `json:"minMarginSettled"`
	SecondsJoiningBelow1 float64 `json:"secondsJoiningBelow1,omitempty"`
	// Unanswered counts readings no member answered (a lost quorum answers nothing).
	Unanswered int `json:"unanswered"`
	// Changing counts readings left out because the membership changed between their reads.
	Changing int `json:"changing,omitempty"`
	// Unconfirmed counts readings in which some member's answer was refused for not reading the
	// member list again after the health check (another member may have answered).
	Unconfirmed int `json:"unconfirmed,omitempty"`
	Readings    int `json:"readings"`
	// BelowOne describes the first maxBelowOne readings with a margin below 1: when, the counts,
	// which member answered, and which voters failed the health check and why (and their raft
	// status); BelowOneLeftOut counts the others (with one voter every reading is below 1).
	BelowOne        []string `json:"belowOne,omitempty"`
	BelowOneLeftOut int      `json:"belowOneLeftOut,omitempty"`
	MachinesCreated []string `json:"machinesCreated"`
}

// maxBelowOne bounds how many readings below margin 1 a summary describes.
const maxBelowOne = 20

func (o *observer) summarize() summary {
	o.mu.Lock()
	defer o.mu.Unlock()
	created := map[string]bool{}
	for _, m := range o.created {
		created[m.Name] = true
	}
	served := map[string]bool{}
	s := summary{MinMargin: 99, MinMarginSettled: 99, MinHealthyVoters: 99, Readings: len(o.views)}
	for i, v := range o.views {
		if v.Unconfirmed {
			s.Unconfirmed++
		}
		if v.Changing {
			s.Changing++
			continue
		}
		if !v.OK {
			s.Unanswered++
			continue
		}
		joining := v.JoiningOnly(created, served)
		for _, name := range v.Healthy {
			served[name] = true
		}
		m := v.Margin()
		s.MinMargin = min(s.MinMargin, m)
		if !joining {
			s.MinMarginSettled = min(s.MinMarginSettled, m)
		}
		s.MinHealthyVoters = min(s.MinHealthyVoters, v.HealthyVoter)
		if m >= 1 {
			continue
		}
		if i+1 < len(o.views) {
			d := o.views[i+1].At.Sub(v.At).Seconds()
			s.SecondsAtMarginBelow1 += d
			if joining {
				s.SecondsJoiningBelow1 += d
			}
		}
		if len(s.BelowOne) == maxBelowOne {
			s.BelowOneLeftOut++
			continue
		}
		what := ""
		if joining {
			what = " (joining)"
		}
		s.BelowOne = append(s.BelowOne, fmt.Sprintf("%s%s voters %v (%d healthy), %d learners, read from %s; unhealthy: %s",
			v.At.UTC().Format("15:04:05"), what, v.Names, v.HealthyVoter, v.Learners, v.From, strings.Join(v.Unhealthy, "; ")))
	}
	for _, m := range o.created {
		s.MachinesCreated = append(s.MachinesCreated, m.Name)
	}
	return s
}

// deletingSince is when the watch first saw the Machine deleting.
func (o *observer) deletingSince(name string) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.deleting[name]
	return t, ok
}

// workloadNodes lists the workload cluster's Nodes through its kubeconfig Secret, with a short
// timeout: an API server that hangs is an answer of "not known yet".
func workloadNodes(c client.Client, ns, cluster string) ([]corev1.Node, error) {
	secret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster + "-kubeconfig"}, secret); err != nil {
		return nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(secret.Data["value"])
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	wc, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, err
	}
	nodes := &corev1.NodeList{}
	if err := wc.List(ctx, nodes); err != nil {
		return nil, err
	}
	return nodes.Items, nil
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
