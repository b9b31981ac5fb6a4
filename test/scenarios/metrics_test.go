package scenarios_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	capienv "github.com/capr-io/capr/test/envtest"
	"github.com/capr-io/capr/test/sandbox"
)

// TestMetricsDuringARemediation scrapes the manager's /metrics endpoint while a control-plane
// remediation runs and after it: the health check's series, the mark, the remediation started and
// finished, its steps, the etcd operations and the fencing outcome (the table in docs/user/metrics.md).
func TestMetricsDuringARemediation(t *testing.T) {
	g := NewWithT(t)
	wc := newCluster(t)
	victim := controlPlane(g, wc)[1]
	ports, err := capienv.FreePorts(1)
	g.Expect(err).NotTo(HaveOccurred())
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	capr, err := sb.StartCAPR(ctx, sandbox.CAPROptions{MetricsBindAddress: addr})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(capr.Stop)
	hc := map[string]string{"namespace": wc.Namespace, "name": "cp"}

	g.Eventually(func(g Gomega) {
		text := scrape(g, addr)
		g.Expect(metric(text, "capr_machinehealthcheck_targets", hc)).To(Equal(3.0))
		g.Expect(metric(text, "capr_machinehealthcheck_unhealthy", hc)).To(Equal(0.0))
		g.Expect(metric(text, "capr_machinehealthcheck_targets_evaluated_total", with(hc, "pass", "full"))).To(BeNumerically(">=", 3))
	}, time.Minute, 200*time.Millisecond).Should(Succeed())

	g.Expect(sb.StopHeartbeat(ctx, wc, victim.Status.NodeRef.Name)).To(Succeed())
	// During the remediation: the mark and the start are counted.
	g.Eventually(func(g Gomega) {
		text := scrape(g, addr)
		g.Expect(metric(text, "capr_machinehealthcheck_unhealthy", hc)).To(Equal(1.0))
		g.Expect(metric(text, "capr_machinehealthcheck_marks_total", with(hc, "reason", caprv1.MachineCAPRHealthCheckUnhealthyNodeReason))).To(Equal(1.0))
		g.Expect(metric(text, "capr_remediations_started_total", map[string]string{"kind": "control-plane", "order": "ScaleUpFirst"})).To(BeNumerically(">=", 1))
	}, time.Minute, 200*time.Millisecond).Should(Succeed())

	waitRemediated(t, wc, victim.Name, 3)
	text := scrape(g, addr)
	g.Expect(metric(text, "capr_remediations_finished_total", map[string]string{"kind": "control-plane", "result": "Succeeded"})).To(BeNumerically(">=", 1))
	for _, step := range []caprv1.StepName{caprv1.StepScaleUp, caprv1.StepWaitForReplacement, caprv1.StepRemoveMember, caprv1.StepDelete} {
		g.Expect(metric(text, "capr_remediation_step_duration_seconds_count", map[string]string{"kind": "control-plane", "step": string(step), "outcome": "Succeeded"})).
			To(BeNumerically(">=", 1), "step %s", step)
	}
	g.Expect(metric(text, "capr_etcd_call_duration_seconds_count", map[string]string{"operation": "inspect"})).To(BeNumerically(">=", 1))
	g.Expect(metric(text, "capr_etcd_call_duration_seconds_count", map[string]string{"operation": "remove_member"})).To(BeNumerically(">=", 1))
	g.Expect(metric(text, "capr_fencing_duration_seconds_count", map[string]string{"kind": "control-plane", "outcome": "Skipped"})).To(BeNumerically(">=", 1))
	g.Expect(strings.Contains(text, "capr_controlplane_lock_waits_total")).To(BeTrue())
}

// scrape reads the metrics endpoint.
func scrape(g Gomega, addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics") //nolint:noctx // a test's short GET
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	b, err := io.ReadAll(resp.Body)
	g.Expect(err).NotTo(HaveOccurred())
	return string(b)
}

// metric returns the value of the first sample of name whose labels include labels (-1 when none).
func metric(text, name string, labels map[string]string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for k, v := range labels {
			match = match && strings.Contains(line, fmt.Sprintf("%s=%q", k, v))
		}
		if !match {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

func with(labels map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for lk, lv := range labels {
		out[lk] = lv
	}
	return out
}
