package etcdutil

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// FuzzEndpointsFromAnnotation checks the parser of the etcd-endpoints annotation, which anyone who
// may annotate a Cluster writes: it never panics, and every address it accepts is one CAPR can dial
// as written (host:port, non-empty host, port 1-65535) under a non-empty member name.
func FuzzEndpointsFromAnnotation(f *testing.F) {
	for _, seed := range []string{
		`{"cp-1":"10.0.0.1:2379","cp-2":"10.0.0.2:2379","cp-3":"10.0.0.3:2379"}`,
		`{"etcd-a":"etcd-a.example.com:2379"}`,
		`{"n1":"[fd00::1]:2379"}`,
		`{"n1":"127.0.0.1:0"}`, `{"n1":"127.0.0.1:65536"}`, `{"n1":":2379"}`, `{"n1":"127.0.0.1"}`,
		`{"":"127.0.0.1:2379"}`, `{"n1":"127.0.0.1:+1"}`, `{"n1":null}`,
		``, `{}`, `null`, `[]`, `"10.0.0.1:2379"`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		endpoints, err := EndpointsFromAnnotation(value)
		if err != nil {
			if !strings.Contains(err.Error(), EndpointsAnnotation) {
				t.Fatalf("%q: error %q does not name the annotation", value, err)
			}
			return
		}
		if len(endpoints) == 0 {
			t.Fatalf("%q: accepted with no member", value)
		}
		for name, addr := range endpoints {
			host, port, err := net.SplitHostPort(addr)
			n, perr := strconv.Atoi(port)
			if name == "" || err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
				t.Fatalf("%q: accepted member %q at %q", value, name, addr)
			}
		}
	})
}

// TestDecideEndpoints is the gate: without the manager flag an annotated Cluster is reached through
// the API server and the annotation is reported as ignored, naming the flag; with it, the annotation
// is dialled, and a bad one is an error.
func TestDecideEndpoints(t *testing.T) {
	annotated := func(v string) *clusterv1.Cluster {
		return &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c1", Annotations: map[string]string{EndpointsAnnotation: v}}}
	}
	plain := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c1"}}

	for _, allow := range []bool{false, true} {
		if d, err := DecideEndpoints(plain, allow); err != nil || d.Endpoints != nil || d.Ignored != "" {
			t.Errorf("no annotation, allow=%v: got %+v, %v; want port-forward", allow, d, err)
		}
	}
	d, err := DecideEndpoints(annotated(`{"n1":"192.0.2.1:2379"}`), false)
	if err != nil || d.Endpoints != nil || !strings.Contains(d.Ignored, AllowEndpointsFlag) || !strings.Contains(d.Ignored, EndpointsAnnotation) {
		t.Errorf("flag off: got %+v, %v; want the annotation ignored, naming it and %s", d, err, AllowEndpointsFlag)
	}
	if d, err := DecideEndpoints(annotated(`not json`), false); err != nil || d.Ignored == "" {
		t.Errorf("flag off, bad annotation: got %+v, %v; want it ignored, not parsed", d, err)
	}
	d, err = DecideEndpoints(annotated(`{"n1":"192.0.2.1:2379"}`), true)
	if err != nil || d.Ignored != "" || d.Endpoints["n1"] != "192.0.2.1:2379" {
		t.Errorf("flag on: got %+v, %v; want the endpoints", d, err)
	}
	if _, err := DecideEndpoints(annotated(`{"n1":"192.0.2.1"}`), true); err == nil || !strings.Contains(err.Error(), `member "n1"`) {
		t.Errorf("flag on, no port: got %v, want an error naming member n1", err)
	}
}

// TestIgnoredAnnotationIsReportedOncePerValue: etcd is read every few seconds; the Warning that the
// annotation is ignored is recorded once per Cluster and annotation value.
func TestIgnoredAnnotationIsReportedOncePerValue(t *testing.T) {
	recorder := events.NewFakeRecorder(10)
	w := &Workload{Recorder: recorder}
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c1", UID: "uid-1",
		Annotations: map[string]string{EndpointsAnnotation: `{"n1":"192.0.2.1:2379"}`}}}
	for range 3 {
		w.reportIgnored(context.Background(), cluster, "ignored")
	}
	cluster.Annotations[EndpointsAnnotation] = `{"n1":"192.0.2.2:2379"}`
	w.reportIgnored(context.Background(), cluster, "ignored")
	w.Forget(cluster.UID)
	w.reportIgnored(context.Background(), cluster, "ignored")
	if n := len(recorder.Events); n != 3 {
		t.Fatalf("got %d events, want 3 (first value, changed value, after Forget)", n)
	}
	if e := <-recorder.Events; !strings.HasPrefix(e, "Warning "+EventEndpointsIgnored+" ") {
		t.Fatalf("event %q", e)
	}
}
