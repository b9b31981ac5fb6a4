package remediation

import (
	"testing"

	. "github.com/onsi/gomega"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

func TestSyncBlockMove(t *testing.T) {
	phases := []caprv1.RemediationPhase{"", caprv1.MachineRemediationPhasePending, caprv1.MachineRemediationPhaseRunning,
		caprv1.MachineRemediationPhaseSucceeded, caprv1.MachineRemediationPhaseFailed}
	for _, phase := range phases {
		for _, had := range []bool{false, true} {
			t.Run(string(phase)+map[bool]string{true: "_annotated", false: ""}[had], func(t *testing.T) {
				g := NewWithT(t)
				mr := &caprv1.MachineRemediation{Status: caprv1.MachineRemediationStatus{Phase: phase}}
				mr.Annotations = map[string]string{"other": "kept"}
				if had {
					mr.Annotations[clusterctlv1.BlockMoveAnnotation] = "x"
				}
				SyncBlockMove(mr)
				g.Expect(mr.Annotations).To(HaveKeyWithValue("other", "kept"))
				if phase == caprv1.MachineRemediationPhaseRunning {
					g.Expect(mr.Annotations).To(HaveKey(clusterctlv1.BlockMoveAnnotation))
				} else {
					g.Expect(mr.Annotations).NotTo(HaveKey(clusterctlv1.BlockMoveAnnotation))
				}
			})
		}
	}
}
