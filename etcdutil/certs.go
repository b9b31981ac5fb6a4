package etcdutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"

	"sigs.k8s.io/cluster-api/util/certs"
)

// ClientCommonName is the subject of the client certificates CAPR signs with a cluster's etcd CA.
const ClientCommonName = "capr.remediation.cluster.x-k8s.io"

// NewClientCertificate signs a fresh client certificate with the etcd CA (PEM-encoded certificate
// and key, as stored in secret <cluster>-etcd). It is valid from five minutes ago, to tolerate clock
// skew, for validity.
func NewClientCertificate(caCertPEM, caKeyPEM []byte, validity time.Duration) (tls.Certificate, error) {
	caCert, err := certs.DecodeCertPEM(caCertPEM)
	if err != nil || caCert == nil {
		return tls.Certificate{}, fmt.Errorf("decoding etcd CA certificate: %w", orNil(err, "no PEM block"))
	}
	caKey, err := certs.DecodePrivateKeyPEM(caKeyPEM)
	if err != nil || caKey == nil {
		return tls.Certificate{}, fmt.Errorf("decoding etcd CA key: %w", orNil(err, "no PEM block"))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating client key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: ClientCommonName},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("signing client certificate with the etcd CA: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parsing client certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: crypto.Signer(key), Leaf: leaf}, nil
}

// TLSConfig trusts servers whose certificate chains to the etcd CA, without checking the host name:
// behind a port-forward the name dialled is a pod name, which is not in the serving certificate (KCP
// does the same).
func TLSConfig(caCertPEM []byte, clientCert tls.Certificate) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caCertPEM) {
		return nil, errors.New("etcd CA certificate is not valid PEM")
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		Certificates:       []tls.Certificate{clientCert},
		InsecureSkipVerify: true, //nolint:gosec // the chain is verified in VerifyConnection below.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("etcd server presented no certificate")
			}
			opts := x509.VerifyOptions{Roots: pool, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
				return fmt.Errorf("etcd server certificate is not signed by the cluster's etcd CA: %w", err)
			}
			return nil
		},
	}, nil
}

func orNil(err error, msg string) error {
	if err != nil {
		return err
	}
	return errors.New(msg)
}
