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

// binaryAndKubeconfig returns the path of the test binary name next to kube-apiserver, and a
// kubeconfig written in dir for a new system:masters user of the environment called name.
func binaryAndKubeconfig(env *capienv.Environment, name, dir string) (bin, kubeconfigPath string, err error) {
	assets, err := capienv.AssetsDir()
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(assets, name)
	if _, err := os.Stat(bin); err != nil {
		return "", "", fmt.Errorf("missing test binary %s in %s: run `make storage-assets` (builds it from the Go module proxy)", name, assets)
	}
	kubeconfig, err := env.KubeConfig(name, []string{"system:masters"})
	if err != nil {
		return "", "", err
	}
	kubeconfigPath = filepath.Join(dir, name+".kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return "", "", fmt.Errorf("writing the kubeconfig of %s: %w", name, err)
	}
	return bin, kubeconfigPath, nil
}

// StartAttacher runs the external-attacher for driver in dir (its kubeconfig and log). It exits on
// its own if the driver's socket goes away (it connects with ExitOnConnectionLoss), so stop it
// before the driver.
func StartAttacher(ctx context.Context, env *capienv.Environment, driver *Driver, dir string) (*Attacher, error) {
	bin, kubeconfigPath, err := binaryAndKubeconfig(env, "csi-attacher", dir)
	if err != nil {
		return nil, err
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
