package worker

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestMachineEventsEnqueueOnlyRequestsOrHooks: a Machine event wakes its request only when the request
// exists, or when the Machine carries one of CAPR's deletion hooks (an orphaned hook is released);
// any other Machine's event would only cost a live read that finds nothing.
func TestMachineEventsEnqueueOnlyRequestsOrHooks(t *testing.T) {
	sch := runtime.NewScheme()
	if err := caprv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	mr := &caprv1.MachineRemediation{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "requested"}}
	r := &Reconciler{Client: fake.NewClientBuilder().WithScheme(sch).WithObjects(mr).Build()}
	machine := func(name string, annotations map[string]string) *clusterv1.Machine {
		return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: annotations}}
	}
	for _, tt := range []struct {
		machine *clusterv1.Machine
		want    int
	}{
		{machine("requested", nil), 1},
		{machine("healthy", nil), 0},
		{machine("hooked", map[string]string{caprv1.FenceBeforeDeleteHookAnnotation: "hooked"}), 1},
		{machine("held", map[string]string{caprv1.ReplicasBackHookAnnotation: "held"}), 1},
	} {
		got := r.machineToRemediation(context.Background(), tt.machine)
		if len(got) != tt.want || (tt.want == 1 && got[0].Name != tt.machine.Name) {
			t.Errorf("Machine %s: got %v, want %d request(s) for it", tt.machine.Name, got, tt.want)
		}
	}
}

// TestMachineEventEnqueuesWhenTheCacheCannotSay: a read of the request that fails for another reason
// than NotFound enqueues the Machine's request: the reconcile's live read then decides.
func TestMachineEventEnqueuesWhenTheCacheCannotSay(t *testing.T) {
	sch := runtime.NewScheme()
	if err := caprv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	failing := interceptor.Funcs{Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
		return errors.New("cache not synced")
	}}
	r := &Reconciler{Client: fake.NewClientBuilder().WithScheme(sch).WithInterceptorFuncs(failing).Build()}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"}}
	if got := r.machineToRemediation(context.Background(), m); len(got) != 1 || got[0].Name != "m" {
		t.Errorf("got %v, want the request of Machine m", got)
	}
}
