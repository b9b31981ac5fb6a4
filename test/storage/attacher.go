package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	capienv "github.com/capr-io/capr/test/envtest"
)

// Attacher is a running CSI external-attacher (v4.12.0, built by `make storage-assets`), connected to
// a Driver's socket and to the environment's API server as a system:masters user.
type Attacher struct {
	*capienv.Process
}

// attacherBinary returns the path of csi-attacher next to kube-apiserver.
func attacherBinary() (string, error) {
	dir, err := capienv.AssetsDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "csi-attacher")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("missing test binary csi-attacher in %s: run `make storage-assets` (builds the CSI external-attacher from the Go module proxy)", dir)
	}
	return bin, nil
}

// StartAttacher runs the external-attacher for driver in dir (its kubeconfig and log). It exits on
// its own if the driver's socket goes away (it connects with ExitOnConnectionLoss), so stop it
// before the driver.
func StartAttacher(ctx context.Context, env *capienv.Environment, driver *Driver, dir string) (*Attacher, error) {
	bin, err := attacherBinary()
	if err != nil {
		return nil, err
	}
	kubeconfig, err := env.KubeConfig("csi-attacher", []string{"system:masters"})
	if err != nil {
		return nil, err
	}
	kubeconfigPath := filepath.Join(dir, "attacher.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return nil, fmt.Errorf("writing the csi-attacher kubeconfig: %w", err)
	}
	proc, err := capienv.StartProcess(ctx, bin, []string{
		"--kubeconfig=" + kubeconfigPath, "--csi-address=" + driver.Socket, "--leader-election=false",
		"--timeout=15s", "--worker-threads=4", "--v=4",
	}, filepath.Join(dir, "csi-attacher.log"))
	if err != nil {
		return nil, err
	}
	return &Attacher{Process: proc}, nil
}

// Stop terminates the process and waits for it.
func (a *Attacher) Stop() {
	a.Kill()
}
