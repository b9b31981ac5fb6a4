// Command demo runs CAPR on the sandbox: a real kube-apiserver and etcd started on this machine,
// a Cluster with three control-plane Machines and two workers, and a CAPR MachineHealthCheck. It
// breaks a worker's Node, shows the health checker marking it and requesting remediation, heals the
// Node and shows the mark cleared. It exits by itself and leaves nothing running.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/controllers"
	capienv "github.com/capr-io/capr/test/envtest"
)

func main() {
	timeout := flag.Duration("timeout", 3*time.Minute, "Give up after this long.")
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.Level(zapcore.ErrorLevel)))
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	err := run(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
		os.Exit(1)
	}
}

type timeline struct{ start time.Time }

func (t *timeline) say(format string, args ...any) {
	fmt.Printf("[%6.2fs] %s\n", time.Since(t.start).Seconds(), fmt.Sprintf(format, args...))
}

func run(ctx context.Context) error {
	tl := &timeline{start: time.Now()}
	tl.say("Starting kube-apiserver %s and etcd (management cluster; it also serves as the workload cluster)", "v1.36.3")
	env, err := capienv.Start(capienv.Options{})
	if err != nil {
		return err
	}
	defer func() {
		tl.say("Stopping the API server and etcd")
		_ = env.Stop()
	}()
	c := env.Client

	mgrCtx, stopMgr := context.WithCancel(ctx)
	defer stopMgr()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:                   controllers.ManagerCacheOptions(env.Scheme, "", 10*time.Minute),
		Client:                  controllers.ManagerClientOptions(),
		GracefulShutdownTimeout: ptr.To(2 * time.Second),
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if _, err := controllers.SetupWithManager(mgrCtx, mgr, controllers.Options{ConnectionRetryInterval: 2 * time.Second}); err != nil {
		return err
	}
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Start(mgrCtx) }()
	defer func() { stopMgr(); <-mgrDone }()
	tl.say("CAPR manager started (health checker)")

	ns, err := capienv.CreateNamespace(ctx, c, "demo")
	if err != nil {
		return err
	}
	cluster := capienv.NewCluster(ns, "demo", clusterv1.ContractVersionedObjectReference{})
	if err := c.Create(ctx, cluster); err != nil {
		return fmt.Errorf("creating Cluster: %w", err)
	}
	if err := capienv.SetClusterReady(ctx, c, cluster, true); err != nil {
		return err
	}
	if err := capienv.CreateKubeconfigSecret(ctx, c, env.Config, cluster); err != nil {
		return err
	}
	names := []string{"cp-0", "cp-1", "cp-2", "worker-0", "worker-1"}
	for _, name := range names {
		m := capienv.NewMachine(ns, cluster.Name, name, name[:2] == "cp")
		if err := c.Create(ctx, m); err != nil {
			return fmt.Errorf("creating Machine %s: %w", name, err)
		}
		if err := capienv.CreateNode(ctx, c, capienv.NewNode(ns+"-"+name, corev1.ConditionTrue, time.Now())); err != nil {
			return err
		}
		if err := capienv.SetMachineNode(ctx, c, m, ns+"-"+name); err != nil {
			return err
		}
	}
	tl.say("Cluster %s/%s created: 3 control-plane Machines, 2 workers, all Nodes Ready", ns, cluster.Name)

	mhc := &caprv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "workers"},
		Spec: caprv1.MachineHealthCheckSpec{
			ClusterName: cluster.Name,
			Selector: caprv1.MachineSelector{MatchExpressions: []caprv1.MachineSelectorRequirement{
				{Key: clusterv1.MachineControlPlaneLabel, Operator: metav1.LabelSelectorOpDoesNotExist},
			}},
			Checks: caprv1.MachineHealthCheckChecks{UnhealthyNodeConditions: []caprv1.UnhealthyNodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, TimeoutSeconds: ptr.To[int32](3)},
				{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, TimeoutSeconds: ptr.To[int32](3)},
			}},
		},
	}
	if err := c.Create(ctx, mhc); err != nil {
		return fmt.Errorf("creating MachineHealthCheck: %w", err)
	}
	tl.say("MachineHealthCheck %q created: a worker is unhealthy when its Node is not Ready for 3s", mhc.Name)
	if err := waitFor(ctx, func() (bool, error) {
		cur := &caprv1.MachineHealthCheck{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(mhc), cur); err != nil {
			return false, err
		}
		return ptr.Deref(cur.Status.CurrentHealthy, 0) == 2, nil
	}); err != nil {
		return fmt.Errorf("waiting for the health check to see 2 healthy workers: %w", err)
	}
	tl.say("Health check sees 2 of 2 workers healthy")

	victim := "worker-1"
	if err := capienv.SetNodeReady(ctx, c, ns+"-"+victim, corev1.ConditionUnknown); err != nil {
		return err
	}
	tl.say("Broke %s: its Node stopped reporting (Ready=Unknown)", victim)
	var mark caprv1.MarkRecord
	if err := waitFor(ctx, func() (bool, error) {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, m); err != nil {
			return false, err
		}
		v, ok := m.Annotations[caprv1.UnhealthyAnnotation]
		if !ok {
			return false, nil
		}
		return true, json.Unmarshal([]byte(v), &mark)
	}); err != nil {
		return fmt.Errorf("waiting for %s to be marked: %w", victim, err)
	}
	tl.say("Marked %s unhealthy: reason=%s, %q", victim, mark.Reason, mark.Message)
	if err := waitFor(ctx, func() (bool, error) {
		return c.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, &caprv1.MachineRemediation{}) == nil, nil
	}); err != nil {
		return fmt.Errorf("waiting for the MachineRemediation of %s: %w", victim, err)
	}
	tl.say("MachineRemediation %s/%s created (remediators act on it; it stays Pending while nothing irreversible is done)", ns, victim)

	if err := capienv.SetNodeReady(ctx, c, ns+"-"+victim, corev1.ConditionTrue); err != nil {
		return err
	}
	tl.say("Healed %s: its Node is Ready again", victim)
	if err := waitFor(ctx, func() (bool, error) {
		m := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, m); err != nil {
			return false, err
		}
		_, marked := m.Annotations[caprv1.UnhealthyAnnotation]
		withdrawn := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: victim}, &caprv1.MachineRemediation{}) != nil
		return !marked && conditions.IsTrue(m, caprv1.MachineHealthCheckSucceededCondition) && withdrawn, nil
	}); err != nil {
		return fmt.Errorf("waiting for the mark of %s to be cleared: %w", victim, err)
	}
	tl.say("Mark cleared on %s and its Pending MachineRemediation withdrawn", victim)
	tl.say("Demo finished: detected, marked, requested, healed, cleared")
	return nil
}

func waitFor(ctx context.Context, cond func() (bool, error)) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("timed out")
		case <-tick.C:
		}
	}
}
