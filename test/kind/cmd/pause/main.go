// Command pause is the kind platform's pod sandbox program (registry.k8s.io/pause is not built from
// any module the Go proxy serves): as PID 1 of a pod it waits for SIGINT or SIGTERM and reaps the
// children that the pod's other processes leave behind.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
