package builder

import caprv1 "github.com/capr-io/capr/api/v1alpha1"

// Steps is, for each order, the control-plane remediation's steps in the order they run, written
// out from the orders' definitions (api/v1alpha1 ControlPlaneOrder, docs/user/control-plane-remediation.md)
// so that a test's expectation is not the product's own plan (remediation/controlplane StepsFor):
//
//   - ScaleUpFirst: the replacement first, and the victim's member leaves only once it votes;
//   - RemoveMemberFirst: the victim's member first, its Machine fenced and deleted while the
//     replacement is provisioned;
//   - DeleteFirst: the member, then the Machine, at the provider's replicas; the provider creates the
//     replacement;
//   - DeleteBeforeMemberRemoval: the Machine first, its member removed by the provider's deletion
//     (RemoveMember after it removes it should it still be listed);
//   - Replace: the Machine only (no control plane to keep yet).
var Steps = map[caprv1.ControlPlaneOrder][]caprv1.StepName{
	caprv1.ControlPlaneOrderScaleUpFirst: {caprv1.StepScaleUp, caprv1.StepWaitForReplacement, caprv1.StepMoveLeader,
		caprv1.StepRemoveMember, caprv1.StepFence, caprv1.StepDelete},
	caprv1.ControlPlaneOrderRemoveMemberFirst: {caprv1.StepMoveLeader, caprv1.StepRemoveMember, caprv1.StepScaleUp,
		caprv1.StepFence, caprv1.StepDelete, caprv1.StepWaitForReplacement},
	caprv1.ControlPlaneOrderDeleteFirst: {caprv1.StepMoveLeader, caprv1.StepRemoveMember, caprv1.StepFence,
		caprv1.StepDelete, caprv1.StepWaitForReplacement},
	caprv1.ControlPlaneOrderDeleteBeforeMemberRemoval: {caprv1.StepMoveLeader, caprv1.StepFence, caprv1.StepDelete,
		caprv1.StepRemoveMember, caprv1.StepWaitForReplacement},
	caprv1.ControlPlaneOrderReplace: {caprv1.StepFence, caprv1.StepDelete},
}
