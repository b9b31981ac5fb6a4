package machinehealthcheck

import (
	"errors"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// Two reconciles can start from the same cached health check when the second one runs before the
// first one's status patch reached the cache: the transition to Unreachable is still reported once.
func TestUnreachableWarningOnceWhenReconcilesReadAStaleHealthCheck(t *testing.T) {
	g := NewWithT(t)
	recorder := events.NewFakeRecorder(10)
	r := &Reconciler{recorder: recorder}
	cached := &caprv1.MachineHealthCheck{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "hc", UID: "uid-1"}}
	for range 2 {
		r.setUnreachable(cached.DeepCopy(), errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))
	}
	g.Expect(recorder.Events).To(HaveLen(1))
}
