package certissuer

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func parse(g Gomega, certPEM []byte) *x509.Certificate {
	block, _ := pem.Decode(certPEM)
	g.Expect(block).NotTo(BeNil())
	cert, err := x509.ParseCertificate(block.Bytes)
	g.Expect(err).NotTo(HaveOccurred())
	return cert
}

// A self-signed certificate serves its DNS names, is its own CA, and is kept until a tenth of its
// life is left; a request for another name is not covered.
func TestSelfSigned(t *testing.T) {
	g := NewWithT(t)
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	req := Request{DNSNames: []string{"capi-webhook-service.capi-system.svc", "capi-webhook-service.capi-system.svc.cluster.local"}}
	issued, err := SelfSigned(req, now)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = tls.X509KeyPair(issued.Cert, issued.Key)
	g.Expect(err).NotTo(HaveOccurred(), "the key does not match the certificate")
	cert := parse(g, issued.Cert)
	g.Expect(cert.DNSNames).To(Equal(req.DNSNames))
	g.Expect(issued.CA).To(Equal(issued.Cert))

	g.Expect(Covers(issued.Cert, issued.CA, req, now)).To(BeTrue())
	g.Expect(Covers(issued.Cert, issued.CA, req, now.Add(300*24*time.Hour))).To(BeTrue())
	g.Expect(Covers(issued.Cert, issued.CA, req, now.Add(330*24*time.Hour))).To(BeFalse(), "less than a tenth of its life left")
	g.Expect(Covers(issued.Cert, issued.CA, Request{DNSNames: []string{"other.svc"}}, now)).To(BeFalse())
	g.Expect(Covers([]byte("garbage"), issued.CA, req, now)).To(BeFalse())

	_, err = SelfSigned(Request{}, now)
	g.Expect(err).To(HaveOccurred(), "a request for nothing")
}

// A ca issuer signs with its CA; the chain verifies against that CA and not against another.
func TestSignedBy(t *testing.T) {
	g := NewWithT(t)
	now := time.Now()
	ca, err := SelfSigned(Request{CommonName: "test-ca", IsCA: true}, now)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(parse(g, ca.Cert).IsCA).To(BeTrue())
	req := Request{DNSNames: []string{"webhook.ns.svc"}}
	issued, err := SignedBy(req, now, ca.Cert, ca.Key)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(issued.CA).To(Equal(ca.Cert))
	g.Expect(Covers(issued.Cert, ca.Cert, req, now)).To(BeTrue())
	other, err := SelfSigned(Request{CommonName: "other-ca", IsCA: true}, now)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(Covers(issued.Cert, other.Cert, req, now)).To(BeFalse())

	leaf, err := SelfSigned(req, now)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = SignedBy(req, now, leaf.Cert, leaf.Key)
	g.Expect(err).To(MatchError(ContainSubstring("not a CA")))
}
