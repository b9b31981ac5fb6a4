package fencing

import "time"

// Bounds of askAgain.
const (
	minAskAgain = 500 * time.Millisecond
	maxAskAgain = 10 * time.Second
)

// askAgain is how long a Fence step that has waited elapsed waits before it asks the backends again.
// No watch brings the remediator back when a fence object in the workload cluster changes (the
// backends read it uncached, NewFencer), so this poll is what notices a confirmation: csi-addons
// usually confirms a NetworkFence within a second, and a flat 10 s requeue put 10 s between the
// confirmation and the out-of-service taint (the demo's timeline). Asking after a quarter of
// the time waited so far, from 0.5 s up to 10 s, notices an early confirmation within a second and
// keeps a fence that takes long from being asked more than every 10 s.
func askAgain(elapsed time.Duration) time.Duration {
	return min(max(elapsed/4, minAskAgain), maxAskAgain)
}
