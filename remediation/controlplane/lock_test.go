package controlplane

import (
	"testing"

	. "github.com/onsi/gomega"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestReleaseLockClearsOurProviderAnnotation: releasing the lock also removes KCP's
// remediation-in-progress when it names this remediation's victim (e.g. re-armed for a Machine KCP had
// already created), never when it names another Machine.
func TestReleaseLockClearsOurProviderAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		kept        bool
	}{
		{"ours", `{"machine":"m-b","timestamp":"2026-01-02T03:04:05Z","retryCount":0}`, false},
		{"KCP's for another Machine", `{"machine":"m-a","timestamp":"2026-01-02T03:04:05Z","retryCount":0}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			cp := kcpObject()
			cp.SetAnnotations(map[string]string{controlplanev1.RemediationInProgressAnnotation: tc.value})
			w := newWorld(t, withControlPlaneObject(cp))
			g.Expect(w.r.takeLock(t.Context(), w.s, 3)).To(Succeed())
			g.Expect(w.controlPlaneAnnotations(g)).To(HaveKey(caprv1.ControlPlaneLockAnnotation))
			g.Expect(w.r.releaseLock(t.Context(), w.s)).To(Succeed())
			annotations := w.controlPlaneAnnotations(g)
			g.Expect(annotations).NotTo(HaveKey(caprv1.ControlPlaneLockAnnotation))
			if tc.kept {
				g.Expect(annotations).To(HaveKeyWithValue(controlplanev1.RemediationInProgressAnnotation, tc.value))
			} else {
				g.Expect(annotations).NotTo(HaveKey(controlplanev1.RemediationInProgressAnnotation))
			}
		})
	}
}
