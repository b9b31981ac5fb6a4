package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/capr-io/capr/hack/manifests"
	capienv "github.com/capr-io/capr/test/envtest"
)

// The built manager binary, run as a process with the identity and RBAC of the rendered clusterctl
// components (a sandbox started WithoutManagerIdentity): what a user installs, not the roles the
// in-process tests bind.

// The manager's ServiceAccount in the rendered components (config/default: namespace capr-system,
// name prefix capr-).
const (
	// ManagerNamespace is the components' namespace.
	ManagerNamespace = "capr-system"
	// ManagerServiceAccount is the manager's ServiceAccount there.
	ManagerServiceAccount = "capr-manager"
)

// variableWithDefault is a clusterctl variable with its default, ${NAME:=default}.
var variableWithDefault = regexp.MustCompile(`\$\{[A-Z0-9_]+:=([^}]*)\}`)

// InstallRenderedComponents creates, from the rendered clusterctl components with every variable at
// its default, everything but the CRDs (installed with the sandbox from the same config/crd/bases)
// and the Deployment (the binary runs as a process instead): the Namespace, the ServiceAccount, the
// roles and their bindings. It also creates the sandbox's control-plane role (labelled for
// aggregation, as a user grants another provider). It returns the manager container's arguments.
func (s *Sandbox) InstallRenderedComponents(ctx context.Context) ([]string, error) {
	root, err := capienv.ModuleRoot()
	if err != nil {
		return nil, err
	}
	rendered, err := manifests.Components(root, "")
	if err != nil {
		return nil, err
	}
	objs, err := utilyaml.ToUnstructured(variableWithDefault.ReplaceAll(rendered, []byte("$1")))
	if err != nil {
		return nil, fmt.Errorf("parsing the rendered components: %w", err)
	}
	var args []string
	for i := range objs {
		o := &objs[i]
		switch o.GetKind() {
		case "CustomResourceDefinition":
			continue
		case "Deployment":
			if args, err = managerArgs(o); err != nil {
				return nil, err
			}
			continue
		}
		if err := s.Client.Create(ctx, o); err != nil && !isAlreadyExists(err) {
			return nil, fmt.Errorf("creating %s %s from the rendered components: %w", o.GetKind(), o.GetName(), err)
		}
	}
	if args == nil {
		return nil, errors.New("the rendered components have no manager Deployment")
	}
	crds, err := CRDDir()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(crds), "rbac", "capr_role.yaml"))
	if err != nil {
		return nil, err
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, role); err != nil {
		return nil, fmt.Errorf("parsing the sandbox's control-plane role: %w", err)
	}
	if err := s.Client.Create(ctx, role); err != nil && !isAlreadyExists(err) {
		return nil, fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	return args, nil
}

// InstallRenderedComponentsOnce is InstallRenderedComponents the first time it is called on this
// sandbox (StartBuiltManager calls it), and nothing afterwards: a test may change the installed RBAC
// before it starts the manager.
func (s *Sandbox) InstallRenderedComponentsOnce(ctx context.Context) error {
	s.installOnce.Do(func() { s.managerArgs, s.installErr = s.InstallRenderedComponents(ctx) })
	return s.installErr
}

// managerArgs returns the arguments of the Deployment's manager container.
func managerArgs(d *unstructured.Unstructured) ([]string, error) {
	containers, _, err := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return nil, fmt.Errorf("reading the containers of Deployment %s: %w", d.GetName(), err)
	}
	for _, c := range containers {
		m, ok := c.(map[string]any)
		if !ok || m["name"] != manifests.ManagerContainer {
			continue
		}
		args, _, err := unstructured.NestedStringSlice(m, "args")
		if err != nil {
			return nil, fmt.Errorf("reading the manager container's args: %w", err)
		}
		return args, nil
	}
	return nil, fmt.Errorf("the Deployment %s has no container %q", d.GetName(), manifests.ManagerContainer)
}

// BuildManager builds the manager binary (the module's main package) into dir and returns its path.
func BuildManager(ctx context.Context, dir string) (string, error) {
	root, err := capienv.ModuleRoot()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "capr")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
	cmd.Dir = root
	if output, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, output)
	}
	return out, nil
}

// ServiceAccountKubeconfig returns a kubeconfig for the sandbox's API server that authenticates as
// the ServiceAccount with a token from the TokenRequest API (what a Pod's projected token is).
func (s *Sandbox) ServiceAccountKubeconfig(ctx context.Context, namespace, name string, ttl time.Duration) ([]byte, error) {
	cs, err := kubernetes.NewForConfig(s.Env.Config)
	if err != nil {
		return nil, err
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(ttl.Seconds()))},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["sandbox"] = &clientcmdapi.Cluster{Server: s.Env.Config.Host, CertificateAuthorityData: s.Env.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["sandbox"] = &clientcmdapi.Context{Cluster: "sandbox", AuthInfo: name}
	cfg.CurrentContext = "sandbox"
	return clientcmd.Write(*cfg)
}

// ManagerProcess is the manager binary running as a process.
type ManagerProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartManagerBinary runs binary with args, authenticated by the kubeconfig file, its output
// appended to logFile.
func StartManagerBinary(binary, kubeconfig, logFile string, args []string) (*ManagerProcess, error) {
	log, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return nil, fmt.Errorf("starting %s: %w", binary, err)
	}
	p := &ManagerProcess{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = log.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended, and how.
func (p *ManagerProcess) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop asks the process to stop (SIGTERM, as the kubelet does) and kills it after 10 s.
func (p *ManagerProcess) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// StartBuiltManager installs the rendered components' identity and RBAC (once per sandbox), builds
// the manager binary into dir and runs it as the rendered ServiceAccount (a TokenRequest token) with
// the rendered Deployment's arguments — leader election on, in the components' namespace — and the
// sandbox's short etcd timeouts. Outside a Pod the lease namespace is not the Pod's and no fixed port
// may be taken; nothing else is changed. It returns the process and the path of its log.
func (s *Sandbox) StartBuiltManager(ctx context.Context, dir string) (*ManagerProcess, string, error) {
	if err := s.InstallRenderedComponentsOnce(ctx); err != nil {
		return nil, "", err
	}
	bin, err := BuildManager(ctx, dir)
	if err != nil {
		return nil, "", err
	}
	kubeconfig, err := s.ServiceAccountKubeconfig(ctx, ManagerNamespace, ManagerServiceAccount, time.Hour)
	if err != nil {
		return nil, "", err
	}
	kubeconfigFile := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigFile, kubeconfig, 0o600); err != nil {
		return nil, "", err
	}
	// Reserved ports, not ":0" (see capienv.Listen): the diagnostics server is TLS.
	ports, err := capienv.FreePorts(2)
	if err != nil {
		return nil, "", err
	}
	args := append(append([]string{}, s.managerArgs...),
		"--leader-election-namespace="+ManagerNamespace,
		fmt.Sprintf("--diagnostics-address=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--health-addr=127.0.0.1:%d", ports[1]),
		"--etcd-dial-timeout-duration=3s",
		"--etcd-call-timeout-duration=3s",
	)
	logFile := filepath.Join(dir, "manager.log")
	p, err := StartManagerBinary(bin, kubeconfigFile, logFile, args)
	if err != nil {
		return nil, "", err
	}
	return p, logFile, nil
}
