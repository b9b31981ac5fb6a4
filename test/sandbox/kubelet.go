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

	"k8s.io/apimachinery/pkg/util/remotecommand"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
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
}

// StartKubelet starts a kubelet stand-in forwarding etcd-pod port 2379 to target.
func StartKubelet(target string) *Kubelet {
	k := &Kubelet{target: target}
	k.server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		portforward.ServePortForward(w, req, k, "", "", &portforward.V4Options{},
			5*time.Minute, remotecommand.DefaultStreamCreationTimeout, []string{portforward.ProtocolV1Name})
	}))
	// Handshakes cut by a stopped kubelet are the fault being injected, not news.
	k.server.Config.ErrorLog = log.New(io.Discard, "", 0)
	k.server.StartTLS()
	return k
}

// Address returns the host and port the Node advertises.
func (k *Kubelet) Address() (string, int32) {
	u, _ := url.Parse(k.server.URL)
	port, _ := strconv.Atoi(u.Port())
	return u.Hostname(), int32(port)
}

// PortForward implements portforward.PortForwarder: it connects the stream to the etcd member.
func (k *Kubelet) PortForward(ctx context.Context, _ string, _ string, _ int32, stream io.ReadWriteCloser) error {
	defer func() { _ = stream.Close() }()
	k.mu.Lock()
	target := k.target
	k.mu.Unlock()
	if target == "" {
		return fmt.Errorf("no etcd on this node")
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

// Stop stops the kubelet stand-in and drops every tunnel through it.
func (k *Kubelet) Stop() {
	k.server.CloseClientConnections()
	k.server.Close()
}
