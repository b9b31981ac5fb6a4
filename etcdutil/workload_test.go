package etcdutil

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// countingReader counts Secret reads.
type countingReader struct {
	client.Reader
	gets atomic.Int32
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

func testCA(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// The CA secret is not read on every health check (it was, uncached, every 5 s per cluster), a new
// certificate is signed only when the secret changed, and a cluster nobody asks for is forgotten.
func TestWorkloadReadsTheCASecretThroughACache(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	certPEM, keyPEM := testCA(t)
	scheme := runtime.NewScheme()
	g.Expect(corev1.AddToScheme(scheme)).To(Succeed())
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1-etcd"},
		Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
	fc := fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()
	reader := &countingReader{Reader: fc}
	clock := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	w := &Workload{SecretReader: reader, AllowEndpointsAnnotation: true, now: func() time.Time { return clock }}
	w.clients.now = w.now
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1", UID: "uid-1",
		Annotations: map[string]string{EndpointsAnnotation: `{"n1":"127.0.0.1:1"}`}}}

	first, err := w.ForCluster(ctx, cluster)
	g.Expect(err).NotTo(HaveOccurred())
	for range 10 {
		clock = clock.Add(5 * time.Second)
		_, err := w.ForCluster(ctx, cluster)
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(reader.gets.Load()).To(BeNumerically("<=", 1), "the CA secret is read at most once a minute")
	tlsOf := func(c *Cluster) any { return c.Connector.(*cachedConnector).generation.(connectorGeneration).tls }

	// After a minute it is read again; unchanged (same resourceVersion), the certificate is kept.
	clock = clock.Add(2 * time.Minute)
	again, err := w.ForCluster(ctx, cluster)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(reader.gets.Load()).To(BeEquivalentTo(2))
	g.Expect(tlsOf(again)).To(BeIdenticalTo(tlsOf(first)))

	// A changed secret (rotated CA) gives a new certificate.
	newCert, newKey := testCA(t)
	g.Expect(fc.Get(ctx, client.ObjectKeyFromObject(secret), secret)).To(Succeed())
	secret.Data = map[string][]byte{corev1.TLSCertKey: newCert, corev1.TLSPrivateKeyKey: newKey}
	g.Expect(fc.Update(ctx, secret)).To(Succeed())
	clock = clock.Add(2 * time.Minute)
	rotated, err := w.ForCluster(ctx, cluster)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tlsOf(rotated)).NotTo(BeIdenticalTo(tlsOf(first)))

	// A cluster nobody asks for any more is forgotten after idleAfter (the sweep runs on any call).
	other := cluster.DeepCopy()
	other.Name, other.UID = "c2", "uid-2"
	secret2 := secret.DeepCopy()
	secret2.Name, secret2.ResourceVersion = "c2-etcd", ""
	g.Expect(fc.Create(ctx, secret2)).To(Succeed())
	clock = clock.Add(idleAfter + 2*time.Minute)
	_, err = w.ForCluster(ctx, other)
	g.Expect(err).NotTo(HaveOccurred())
	w.mu.Lock()
	g.Expect(w.certs).To(HaveLen(1))
	g.Expect(w.certs).To(HaveKey(other.UID))
	w.mu.Unlock()
	w.Forget(other.UID)
	w.mu.Lock()
	g.Expect(w.certs).To(BeEmpty())
	w.mu.Unlock()
}
