package envtest

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// Suite is the Environment of one test package's run (Run): what the package's setup starts in the
// background and what it leaves to undo stop once the tests have run, before the API server does.
type Suite struct {
	*Environment
	// Ctx is cancelled once the tests have run: the managers and controllers setup starts with it
	// (e.g. controllers.SetupWithManager's context) stop then.
	Ctx context.Context

	cancel   context.CancelFunc
	done     chan error
	started  int
	cleanups []func()
	code     int
}

// Go runs start (e.g. a manager's Start) in the background with Ctx. Run waits for it to return
// once the tests have run; an error fails the package and prints the controller workers that have
// not returned (StuckWorkers), as a manager outliving its graceful-shutdown timeout does.
func (s *Suite) Go(start func(context.Context) error) {
	s.started++
	go func() { s.done <- start(s.Ctx) }()
}

// Cleanup registers f to run once the tests have run and the background work has stopped, before the
// API server stops; the last registered runs first (as defer).
func (s *Suite) Cleanup(f func()) {
	s.cleanups = append(s.cleanups, f)
}

// Failed reports whether the tests failed: for a Cleanup that prints logs only then.
func (s *Suite) Failed() bool { return s.code != 0 }

// Run is the TestMain of an envtest suite: it starts an Environment with opts, hands it to setup
// (which may start managers with Suite.Go and register Suite.Cleanup), runs the package's tests,
// stops the background work, runs the cleanups and stops the API server. It returns the exit code
// for os.Exit. A setup error names what failed and fails the package without running a test.
func Run(m *testing.M, opts Options, setup func(*Suite) error) int {
	env, err := Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start envtest: %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Suite{Environment: env, Ctx: ctx, cancel: cancel, done: make(chan error)}
	defer s.stop()
	if setup != nil {
		if err := setup(s); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: setting up the suite: %v\n", err)
			s.code = 1
			return s.code
		}
	}
	s.code = m.Run()
	return s.stop()
}

// stop cancels Ctx, waits for what Go started and runs the cleanups; once.
func (s *Suite) stop() int {
	s.cancel()
	for ; s.started > 0; s.started-- {
		if err := <-s.done; err != nil {
			fmt.Fprintf(os.Stderr, "%s\nmanager stopped with error: %v\n", StuckWorkers(), err)
			if s.code == 0 {
				s.code = 1
			}
		}
	}
	for len(s.cleanups) > 0 {
		f := s.cleanups[len(s.cleanups)-1]
		s.cleanups = s.cleanups[:len(s.cleanups)-1]
		f()
	}
	return s.code
}
