package envtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeControllerManager controller names (kube-controller-manager v1.36 --controllers).
const (
	GarbageCollectorController    = "garbage-collector-controller"
	NodeLifecycleController       = "node-lifecycle-controller"
	PodGarbageCollectorController = "pod-garbage-collector-controller"
	AttachDetachController        = "persistentvolume-attach-detach-controller"
	// ClusterRoleAggregationController fills ClusterRoles that have an aggregationRule.
	ClusterRoleAggregationController = "clusterrole-aggregation-controller"
)

// DefaultKubeControllerManagerControllers are the controllers StartKubeControllerManager runs when
// KubeControllerManagerOptions.Controllers is empty: the ones that act on Nodes and on what a
// deleted or unreachable Node leaves behind.
var DefaultKubeControllerManagerControllers = []string{
	GarbageCollectorController,
	NodeLifecycleController,
	PodGarbageCollectorController,
	AttachDetachController,
}

// KubeControllerManagerOptions configures StartKubeControllerManager.
type KubeControllerManagerOptions struct {
	// Controllers to run (--controllers); DefaultKubeControllerManagerControllers when empty.
	Controllers []string
	// NodeMonitorGracePeriod (--node-monitor-grace-period): how long a Node may go without a
	// heartbeat (Lease renewal or Ready condition update) before it is marked Ready=Unknown.
	// kube-controller-manager's default (50s) when zero.
	NodeMonitorGracePeriod time.Duration
	// NodeMonitorPeriod (--node-monitor-period): how often Node health is checked; 1s when zero.
	NodeMonitorPeriod time.Duration
	// ExtraArgs are appended to the command line (later flags win).
	ExtraArgs []string
	// StartTimeout bounds the wait until every controller is running; 2m when zero.
	StartTimeout time.Duration
	// Dir receives the kubeconfig and the log; a temporary directory removed by Stop when empty.
	Dir string
}

// KubeControllerManager is a running kube-controller-manager built by `make envtest-assets`.
type KubeControllerManager struct {
	*Process
	// Port is the secure (HTTPS) port serving /healthz on 127.0.0.1.
	Port int

	dir      string
	removeOn bool
	stopOnce sync.Once
}

// kubeControllerManagerBinary returns the path of the kube-controller-manager binary next to
// kube-apiserver and etcd.
func kubeControllerManagerBinary() (string, error) {
	dir, err := AssetsDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("missing test binary kube-controller-manager in %s: run `make envtest-assets` (builds kube-controller-manager v1.36.3 from the Go module proxy) or set %s", dir, AssetsEnv)
	}
	return bin, nil
}

// StartKubeControllerManager runs a real kube-controller-manager against the environment's API
// server as a system:masters user and returns once every requested controller is running (its
// health check passes on /healthz). The process is killed when ctx is done or on Stop.
func (e *Environment) StartKubeControllerManager(ctx context.Context, opts KubeControllerManagerOptions) (*KubeControllerManager, error) {
	bin, err := kubeControllerManagerBinary()
	if err != nil {
		return nil, err
	}
	controllers := opts.Controllers
	if len(controllers) == 0 {
		controllers = DefaultKubeControllerManagerControllers
	}
	monitorPeriod := opts.NodeMonitorPeriod
	if monitorPeriod == 0 {
		monitorPeriod = time.Second
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}

	dir, removeOn := opts.Dir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "capr-kcm-"); err != nil {
			return nil, fmt.Errorf("creating a directory for kube-controller-manager: %w", err)
		}
		removeOn = true
	}
	cleanup := func() {
		if removeOn {
			_ = os.RemoveAll(dir)
		}
	}

	user, err := e.env.AddUser(envtest.User{Name: "kube-controller-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("adding the kube-controller-manager user to the API server: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("writing the kube-controller-manager kubeconfig: %w", err)
	}
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		cleanup()
		return nil, fmt.Errorf("writing the kube-controller-manager kubeconfig: %w", err)
	}

	// The free port is found by binding and releasing it (reserved against envtest's own port
	// suggestions, see FreePorts); a process outside envtest may still take it in between, so a start
	// that fails on the port is retried with a new one.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := FreePort()
		if err != nil {
			cleanup()
			return nil, err
		}
		args := []string{
			"--kubeconfig=" + kubeconfigPath,
			"--authentication-kubeconfig=" + kubeconfigPath,
			"--authorization-kubeconfig=" + kubeconfigPath,
			// envtest's API server has no request-header CA: do not look it up (it only logs errors).
			"--authentication-skip-lookup=true",
			// Health checks need no credentials (the readiness probe below is anonymous).
			"--authorization-always-allow-paths=/healthz,/readyz,/livez",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--leader-elect=false",
			"--use-service-account-credentials=false",
			"--controllers=" + strings.Join(controllers, ","),
			"--node-monitor-period=" + monitorPeriod.String(),
			"--v=2",
		}
		if opts.NodeMonitorGracePeriod > 0 {
			args = append(args, "--node-monitor-grace-period="+opts.NodeMonitorGracePeriod.String())
		}
		args = append(args, opts.ExtraArgs...)

		proc, err := StartProcess(ctx, bin, args, filepath.Join(dir, fmt.Sprintf("kube-controller-manager-%d.log", attempt)))
		if err != nil {
			cleanup()
			return nil, err
		}
		k := &KubeControllerManager{Process: proc, Port: port, dir: dir, removeOn: removeOn}
		err = k.waitRunning(ctx, controllers, timeout)
		if err == nil {
			return k, nil
		}
		lastErr = err
		k.Kill()
		if !strings.Contains(k.LogTail(20), "address already in use") {
			break
		}
	}
	cleanup()
	return nil, lastErr
}

var errExited = errors.New("kube-controller-manager exited early")

// waitRunning polls /healthz?verbose until it answers 200 and lists a passing check for every
// controller: kube-controller-manager registers those checks once it has built the controllers and
// is about to start them (it serves /healthz before that, with fewer checks).
func (k *KubeControllerManager) waitRunning(ctx context.Context, controllers []string, timeout time.Duration) error {
	httpClient := &http.Client{
		Timeout: 2 * time.Second,
		// The serving certificate is self-signed in memory by kube-controller-manager.
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // local test process
	}
	defer httpClient.CloseIdleConnections()
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz?verbose", k.Port)
	lastProbe := "no probe yet"
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-k.Exited():
			return false, fmt.Errorf("%w (%s); last lines of %s:\n%s", errExited, k.ExitStatus(), k.LogFile, k.LogTail(40))
		default:
		}
		status, body, err := get(ctx, httpClient, url)
		if err != nil {
			lastProbe = fmt.Sprintf("GET %s: %v", url, err)
			return false, nil // not serving yet: poll again
		}
		lastProbe = fmt.Sprintf("GET %s: %d\n%s", url, status, body)
		if status != http.StatusOK {
			return false, nil
		}
		for _, c := range controllers {
			if !strings.Contains(body, "[+]"+c+" ok") {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		if errors.Is(err, errExited) {
			return err
		}
		return fmt.Errorf("kube-controller-manager did not start controllers %v within %s (%w; last probe: %s); last lines of %s:\n%s", controllers, timeout, err, lastProbe, k.LogFile, k.LogTail(40))
	}
	return nil
}

func get(ctx context.Context, c *http.Client, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(body), err
}

// Stop terminates kube-controller-manager, waits for it to exit and removes its temporary
// directory (not KubeControllerManagerOptions.Dir).
func (k *KubeControllerManager) Stop() {
	k.stopOnce.Do(func() {
		k.Kill()
		if k.removeOn {
			_ = os.RemoveAll(k.dir)
		}
	})
}
