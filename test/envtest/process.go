package envtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a test binary run as a child process (kube-controller-manager, the CSI
// external-attacher), its output in LogFile. It is sent SIGTERM when the context it was started
// with is done, and killed 10 s later.
type Process struct {
	// LogFile holds the process's stdout and stderr.
	LogFile string

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// StartProcess starts bin with args, its output in logFile.
func StartProcess(ctx context.Context, bin string, args []string, logFile string) (*Process, error) {
	log, err := os.Create(logFile)
	if err != nil {
		return nil, fmt.Errorf("creating the log of %s: %w", bin, err)
	}
	p := &Process{LogFile: logFile, exited: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	p.cmd.WaitDelay = 10 * time.Second
	if err := p.cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		_ = log.Close()
		close(p.exited)
	}()
	return p, nil
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} {
	return p.exited
}

// ExitStatus describes how the process ended; call only after Exited is closed.
func (p *Process) ExitStatus() string {
	if p.waitErr == nil {
		return "exit status 0"
	}
	return p.waitErr.Error()
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string {
	raw, err := os.ReadFile(p.LogFile)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.LogFile, err)
	}
	lines := bytes.Split(bytes.TrimRight(raw, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// Kill terminates the process (SIGTERM, SIGKILL after 10 s) and waits for it.
func (p *Process) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}
