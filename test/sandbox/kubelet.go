package sandbox

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	capienv "github.com/capr-io/capr/test/envtest"
)

// Kubelet is a kubelet stand-in for one sandbox Node: an HTTPS server whose address and port are in
// the Node's status, serving the API server's pods/portforward requests to the Node's etcd member
// (the path KCP and CAPR use to reach etcd). kube-apiserver does not verify kubelet serving
// certificates unless told to, so httptest's certificate is enough. Stopping it is the "kubelet
// down" fault: the etcd member keeps running but cannot be reached through the API server.
type Kubelet struct {
	server *httptest.Server
	mu     sync.Mutex
	// target is host:port of the etcd member's client endpoint ("" for workers).
	target string
	// stopBeat stops the Lease heartbeat (nil when there is none).
	stopBeat context.CancelFunc
	// apiServer is host:port that port 6443 (the kube-apiserver-<node> static pod) leads to ("" when
	// the node runs no API server).
	apiServer string
	// hole is the listener of a black-holed kubelet (BlackHole), nil otherwise.
	hole net.Listener
}

// StartKubelet starts a kubelet stand-in forwarding etcd-pod port 2379 to target.
func StartKubelet(target string) *Kubelet {
	k := &Kubelet{target: target}
	k.start()
	return k
}

// StartControlPlaneKubelet starts a kubelet stand-in of a kubeadm control-plane node: port 2379 (the
// etcd-<node> pod) leads to the node's etcd member, port 6443 (kube-apiserver-<node>) to apiServer,
// whose serving certificate KCP inspects for its expiry.
func StartControlPlaneKubelet(etcd, apiServer string) *Kubelet {
	k := &Kubelet{target: etcd, apiServer: apiServer}
	k.start()
	return k
}

func (k *Kubelet) start() {
	k.server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		portforward.ServePortForward(w, req, k, "", "", &portforward.V4Options{},
			5*time.Minute, remotecommand.DefaultStreamCreationTimeout, []string{portforward.ProtocolV1Name})
	}))
	// Handshakes cut by a stopped kubelet are the fault being injected, not news.
	k.server.Config.ErrorLog = log.New(io.Discard, "", 0)
	l, err := capienv.Listen()
	if err != nil {
		panic(fmt.Sprintf("stand-in kubelet: %v", err)) // as httptest does when it cannot listen
	}
	_ = k.server.Listener.Close()
	k.server.Listener = l
	k.server.StartTLS()
}

// Address returns the host and port the Node advertises.
func (k *Kubelet) Address() (string, int32) {
	u, _ := url.Parse(k.server.URL)
	port, _ := strconv.Atoi(u.Port())
	return u.Hostname(), int32(port)
}

// PortForward implements portforward.PortForwarder: it connects the stream to the etcd member.
func (k *Kubelet) PortForward(ctx context.Context, _ string, _ string, port int32, stream io.ReadWriteCloser) error {
	defer func() { _ = stream.Close() }()
	k.mu.Lock()
	target := k.target
	if port == 6443 {
		target = k.apiServer
	}
	k.mu.Unlock()
	if target == "" {
		return fmt.Errorf("nothing listens on port %d of this node", port)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return fmt.Errorf("dialing etcd member at %s: %w", target, err)
	}
	defer func() { _ = conn.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// leaseRenewInterval is how often the kubelet stand-in renews its Node's Lease (the kubelet's default is
// 10 s for a 40 s lease; shorter here so that the node lifecycle controller's short grace period in the
// sandbox still sees a steady heartbeat).
const leaseRenewInterval = 2 * time.Second

// startHeartbeat renews the Node's Lease in kube-node-lease until StopHeartbeat or Stop: the signal the
// node lifecycle controller reads. A stopped heartbeat is a real one. Starting a running heartbeat
// does nothing.
func (k *Kubelet) startHeartbeat(c client.Client, node string) {
	ctx, cancel := context.WithCancel(context.Background())
	k.mu.Lock()
	if k.stopBeat != nil {
		k.mu.Unlock()
		cancel()
		return
	}
	k.stopBeat = cancel
	k.mu.Unlock()
	go func() {
		ticker := time.NewTicker(leaseRenewInterval)
		defer ticker.Stop()
		for {
			renewLease(ctx, c, node)
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
		}
	}()
}

func renewLease(ctx context.Context, c client.Client, node string) {
	now := metav1.NewMicroTime(time.Now())
	lease := nodeLease(node)
	if err := c.Get(ctx, client.ObjectKeyFromObject(lease), lease); err != nil {
		if !apierrors.IsNotFound(err) {
			return // retried on the next tick
		}
		lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: &now}
		_ = c.Create(ctx, lease)
		return
	}
	base := lease.DeepCopy()
	lease.Spec.RenewTime = &now
	_ = c.Patch(ctx, lease, client.MergeFrom(base))
}

// StopHeartbeat stops renewing the Node's Lease; the kubelet keeps serving.
func (k *Kubelet) StopHeartbeat() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopBeat != nil {
		k.stopBeat()
		k.stopBeat = nil
	}
}

// Stop stops the kubelet stand-in and drops every tunnel through it (and a black hole's connections).
func (k *Kubelet) Stop() {
	k.StopHeartbeat()
	k.server.CloseClientConnections()
	k.server.Close()
	k.mu.Lock()
	hole := k.hole
	k.hole = nil
	k.mu.Unlock()
	if hole != nil {
		_ = hole.Close()
	}
}

// BlackHole turns the kubelet stand-in into a powered-off node behind a network that keeps accepting
// its connections: its heartbeat stops, every tunnel through it is dropped, and its address then
// accepts connections that are never answered, so the API server's port-forward to the node waits
// for a TLS handshake until the caller's own timeout. Stop closes them.
func (k *Kubelet) BlackHole() error {
	addr := k.server.Listener.Addr().String()
	k.Stop()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("black-holing the kubelet at %s: %w", addr, err)
	}
	k.mu.Lock()
	k.hole = l
	k.mu.Unlock()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return nil
}
