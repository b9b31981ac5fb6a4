// Package certissuer is the kind platform's offline stand-in for cert-manager (docs/developer/kind.md):
// cert-manager's controller, webhook and cainjector are separate Go modules that the Go module proxy
// does not serve, so they cannot be built here. clusterctl installs this in their place, from a local
// repository, together with cert-manager's own CRDs; it does the two things Cluster API's providers
// ask of cert-manager:
//
//   - it issues the Certificates of Issuers and ClusterIssuers with selfSigned or ca: a TLS Secret
//     (tls.crt, tls.key, ca.crt) for the Certificate's DNS names, and the Certificate's Ready condition;
//   - it injects a Certificate's CA into what carries cert-manager.io/inject-ca-from: webhook
//     configurations, and CRDs with a conversion webhook.
//
// It does not renew (certificates live a year), and it has no ACME, no webhook, no CertificateRequests.
package certissuer

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Validity is how long an issued certificate lives.
const Validity = 365 * 24 * time.Hour

// Issued is a certificate and its key, PEM-encoded, and the CA that signed it.
type Issued struct {
	Cert, Key, CA []byte
}

// Request is what a Certificate asks for.
type Request struct {
	CommonName string
	DNSNames   []string
	IsCA       bool
}

// SelfSigned issues req signed by its own key; the CA is the certificate itself.
func SelfSigned(req Request, now time.Time) (Issued, error) {
	return issue(req, now, nil, nil)
}

// SignedBy issues req signed by the CA in caCert/caKey (PEM), as cert-manager's ca issuer does.
func SignedBy(req Request, now time.Time, caCert, caKey []byte) (Issued, error) {
	pair, err := tls.X509KeyPair(caCert, caKey)
	if err != nil {
		return Issued{}, fmt.Errorf("reading the CA's key pair: %w", err)
	}
	parent, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return Issued{}, fmt.Errorf("parsing the CA's certificate: %w", err)
	}
	if !parent.IsCA {
		return Issued{}, errors.New("the CA's certificate is not a CA")
	}
	return issue(req, now, parent, pair.PrivateKey)
}

func issue(req Request, now time.Time, parent *x509.Certificate, parentKey any) (Issued, error) {
	if req.CommonName == "" && len(req.DNSNames) == 0 {
		return Issued{}, errors.New("neither a common name nor DNS names")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Issued{}, fmt.Errorf("generating a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return Issued{}, fmt.Errorf("generating a serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: req.CommonName},
		DNSNames:              req.DNSNames,
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  req.IsCA,
	}
	if req.IsCA {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return Issued{}, fmt.Errorf("signing: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Issued{}, fmt.Errorf("encoding the key: %w", err)
	}
	out := Issued{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	out.CA = out.Cert
	if parent != nil {
		out.CA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: parent.Raw})
	}
	return out, nil
}

// Covers reports whether certPEM is valid at now for every DNS name of req, is still valid for more
// than a tenth of its life, and was signed by caPEM: whether a Secret that holds them can be kept.
func Covers(certPEM, caPEM []byte, req Request, now time.Time) bool {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter.Add(-cert.NotAfter.Sub(cert.NotBefore)/10)) {
		return false
	}
	for _, name := range req.DNSNames {
		if cert.VerifyHostname(name) != nil {
			return false
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return false
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err == nil
}
