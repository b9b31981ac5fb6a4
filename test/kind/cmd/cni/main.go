// Command cni is the kind platform's pod network (kind's kindnetd is not built from any module the Go
// proxy serves). It runs on every node as a host-network DaemonSet (test/kind/manifests/cni.yaml) and
// does what kindnetd does for a single-subnet cluster on one docker network:
//
//   - it writes a ptp + host-local CNI configuration for its node's podCIDR, which makes the node Ready;
//   - it routes every other node's podCIDR via that node's InternalIP;
//   - it masquerades pod traffic that leaves the cluster's pod subnet.
//
// No NetworkPolicy, no IPv6. It polls the Nodes every few seconds: a new node is routed within one
// round, which is all the e2e suite needs.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const period = 5 * time.Second

func main() {
	node, subnet := os.Getenv("NODE_NAME"), os.Getenv("POD_SUBNET")
	confDir := os.Getenv("CNI_CONF_DIR")
	if confDir == "" {
		confDir = "/etc/cni/net.d"
	}
	if node == "" || subnet == "" {
		fmt.Fprintln(os.Stderr, "cni: NODE_NAME and POD_SUBNET must be set")
		os.Exit(2)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni:", err)
		os.Exit(1)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for {
		if err := round(ctx, cs, node, subnet, confDir); err != nil {
			fmt.Fprintln(os.Stderr, "cni:", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

func round(ctx context.Context, cs kubernetes.Interface, self, subnet, confDir string) error {
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if n.Spec.PodCIDR == "" {
			continue
		}
		if n.Name == self {
			if err := writeConf(confDir, n.Spec.PodCIDR); err != nil {
				return err
			}
			continue
		}
		if ip := internalIP(n); ip != "" {
			if err := run("ip", "route", "replace", n.Spec.PodCIDR, "via", ip); err != nil {
				return err
			}
		}
	}
	masq := []string{"POSTROUTING", "-s", subnet, "!", "-d", subnet, "-j", "MASQUERADE"}
	if run("iptables", append([]string{"-t", "nat", "-C"}, masq...)...) != nil {
		return run("iptables", append([]string{"-t", "nat", "-A"}, masq...)...)
	}
	return nil
}

func internalIP(n corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// writeConf writes the node's CNI configuration if it differs (atomically: the kubelet reads it).
func writeConf(dir, podCIDR string) error {
	conf := map[string]any{
		"cniVersion": "0.3.1",
		"name":       "capr-kind",
		"plugins": []any{
			map[string]any{
				"type": "ptp", "ipMasq": false, "mtu": 1500,
				"ipam": map[string]any{
					"type": "host-local", "dataDir": "/run/cni-ipam-state",
					"routes": []any{map[string]any{"dst": "0.0.0.0/0"}},
					"ranges": []any{[]any{map[string]any{"subnet": podCIDR}}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
		},
	}
	raw, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, "10-capr-kind.conflist")
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, raw) {
		return nil
	}
	if err := os.WriteFile(path+".tmp", raw, 0o644); err != nil {
		return fmt.Errorf("writing the CNI configuration: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("writing the CNI configuration: %w", err)
	}
	fmt.Println("cni: wrote", path, "for", podCIDR)
	return nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return nil
}
