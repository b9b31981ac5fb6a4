package sandbox

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"time"

	capienv "github.com/capr-io/capr/test/envtest"
)

// apiServerCertEndpoint stands in for port 6443 of a kubeadm control-plane node as far as KCP looks
// at it: KCP reads the expiry of the serving certificate with CN kube-apiserver over a port-forward
// to kube-apiserver-<node> (controlplane/kubeadm/pkg workload_cluster.go GetAPIServerCertificateExpiry).
// The sandbox's real API server is envtest's, whose certificate has another CN, so the kubelet
// stand-ins forward port 6443 here: a TLS listener with a kubeadm-like certificate valid for a year.
type apiServerCertEndpoint struct {
	listener net.Listener
}

func startAPIServerCertEndpoint() (*apiServerCertEndpoint, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("creating the kube-apiserver serving certificate stand-in: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
	raw, err := capienv.Listen()
	if err != nil {
		return nil, err
	}
	l := tls.NewListener(raw, cfg)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return // closed
			}
			go func() {
				defer func() { _ = conn.Close() }()
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				_ = conn.(*tls.Conn).Handshake()
				_, _ = conn.Read(make([]byte, 1)) // until the client hangs up
			}()
		}
	}()
	return &apiServerCertEndpoint{listener: l}, nil
}

// Address returns host:port of the endpoint.
func (e *apiServerCertEndpoint) Address() string { return e.listener.Addr().String() }

// Stop closes the listener.
func (e *apiServerCertEndpoint) Stop() { _ = e.listener.Close() }
