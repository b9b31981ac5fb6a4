package remediation

import (
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// SyncBlockMove keeps clusterctl's block-move annotation on a MachineRemediation exactly while it is
// Running. clusterctl move creates objects without their status (cmd/clusterctl/client/cluster
// mover.go, createTargetObject) and a running remediation's status is its only record (the steps
// done, the replicas to return to): moved mid-flight it could not be finished or undone. With the
// annotation, move waits for it after pausing the Cluster (mover.go, waitReadyForMove); CAPR stops on
// a paused Cluster, so the move gives up with an error naming the request and leaves the source
// Cluster paused — unpause it and move once no remediation runs. Persist calls it before
// every write, so the annotation never outlives the Running phase.
func SyncBlockMove(mr *caprv1.MachineRemediation) {
	_, has := mr.Annotations[clusterctlv1.BlockMoveAnnotation]
	running := mr.Status.Phase == caprv1.MachineRemediationPhaseRunning
	switch {
	case running && !has:
		if mr.Annotations == nil {
			mr.Annotations = map[string]string{}
		}
		mr.Annotations[clusterctlv1.BlockMoveAnnotation] = "a running remediation's status cannot be moved"
	case !running && has:
		delete(mr.Annotations, clusterctlv1.BlockMoveAnnotation)
	}
}
