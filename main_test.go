package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/yaml"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
	"github.com/capr-io/capr/etcdutil"
)

func TestCheckCRDsNamesWhatIsMissing(t *testing.T) {
	g := NewWithT(t)
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{clusterv1.GroupVersion, caprv1.GroupVersion})
	for _, kind := range []string{"Cluster", "Machine"} {
		mapper.Add(clusterv1.GroupVersion.WithKind(kind), meta.RESTScopeNamespace)
	}
	err := checkCRDs(mapper)
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("CRD for MachineHealthCheck.remediation.cluster.x-k8s.io is not installed"))
	g.Expect(err.Error()).To(ContainSubstring("make install"))
	g.Expect(err.Error()).NotTo(ContainSubstring("Machine.cluster.x-k8s.io"))

	for _, kind := range []string{"MachineHealthCheck", "MachineRemediation", "MachineRemediationTemplate"} {
		mapper.Add(schema.GroupVersionKind{Group: caprv1.GroupVersion.Group, Version: "v1alpha1", Kind: kind}, meta.RESTScopeNamespace)
	}
	g.Expect(checkCRDs(mapper)).To(Succeed())
}

// The Deployment in config/manager is what clusterctl installs: a flag that main.go does not define
// would crash-loop the manager, and a clusterctl variable whose default differs from the flag's
// default would make the documented defaults lie.
func TestManagerManifestUsesRealFlagsWithTheirDefaults(t *testing.T) {
	g := NewWithT(t)
	raw, err := os.ReadFile(filepath.Join("config", "manager", "manager.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var args []string
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		d := &appsv1.Deployment{}
		g.Expect(yaml.Unmarshal([]byte(doc), d)).To(Succeed())
		if d.Kind != "Deployment" {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == "manager" {
				args = c.Args
			}
		}
	}
	g.Expect(args).NotTo(BeEmpty(), "the manager container of config/manager/manager.yaml has no args")

	variable := regexp.MustCompile(`^\$\{(CAPR_[A-Z0-9_]+):=(.*)\}$`)
	defaults := pflag.NewFlagSet("defaults", pflag.ContinueOnError)
	(&options{}).bind(defaults)
	seen := map[string]bool{}
	for _, arg := range args {
		name, value, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		f := defaults.Lookup(name)
		g.Expect(f).NotTo(BeNil(), "%s: main.go defines no flag --%s", arg, name)
		m := variable.FindStringSubmatch(value)
		if m == nil {
			continue
		}
		g.Expect(seen[m[1]]).To(BeFalse(), "variable %s is used twice", m[1])
		seen[m[1]] = true
		// The default must parse, and mean what the flag means when it is not given.
		parsed := pflag.NewFlagSet("parsed", pflag.ContinueOnError)
		(&options{}).bind(parsed)
		g.Expect(parsed.Set(name, m[2])).To(Succeed(), "%s: the default does not parse", arg)
		if name == "zap-log-level" {
			// Unset, zap's production defaults log at info.
			g.Expect(m[2]).To(Equal("info"))
			continue
		}
		g.Expect(parsed.Lookup(name).Value.String()).To(Equal(f.DefValue), "%s: the default differs from main.go's", arg)
	}
	g.Expect(seen).To(HaveKey("CAPR_LOG_LEVEL"))
	g.Expect(args).To(ContainElement("--leader-elect"))
}

// CAPI's ClusterCache reaches the cluster the manager runs on directly, not through its load
// balancer, only when it knows its own Pod (clustercache.SetupWithManager reads POD_NAMESPACE,
// POD_NAME and POD_UID), as on a self-hosted management cluster after clusterctl move. CAPI's
// managers set the three from the downward API; so must CAPR's Deployment.
func TestManagerManifestGivesThePodItsOwnIdentity(t *testing.T) {
	g := NewWithT(t)
	raw, err := os.ReadFile(filepath.Join("config", "manager", "manager.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	env := map[string]string{}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		d := &appsv1.Deployment{}
		g.Expect(yaml.Unmarshal([]byte(doc), d)).To(Succeed())
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name != "manager" {
				continue
			}
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					env[e.Name] = e.ValueFrom.FieldRef.FieldPath
				}
			}
		}
	}
	g.Expect(env).To(Equal(map[string]string{"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name", "POD_UID": "metadata.uid"}))
}

// A reconcile timeout shorter than an etcd inspection would cut legitimate control-plane
// remediations short: refused, naming the flag.
func TestReconcileTimeoutMustLeaveRoomForEtcd(t *testing.T) {
	g := NewWithT(t)
	fs := pflag.NewFlagSet("capr", pflag.ContinueOnError)
	o := &options{}
	o.bind(fs)
	g.Expect(fs.Parse(nil)).To(Succeed())
	g.Expect(o.validate()).To(Succeed(), "the defaults are valid")

	g.Expect(fs.Parse([]string{"--reconcile-timeout=30s"})).To(Succeed())
	err := o.validate()
	g.Expect(err).To(HaveOccurred())
	g.Expect(err.Error()).To(ContainSubstring("--reconcile-timeout=30s"))
	g.Expect(err.Error()).To(ContainSubstring("at least 1m10s"))

	g.Expect(fs.Parse([]string{"--reconcile-timeout=1m10s"})).To(Succeed())
	g.Expect(o.validate()).To(Succeed())
	g.Expect(fs.Parse([]string{"--etcd-call-timeout-duration=30s"})).To(Succeed())
	g.Expect(o.validate()).To(MatchError(ContainSubstring("at least 2m10s")), "the bound follows the etcd timeouts")
}

// TestEtcdEndpointsAnnotationIsOffByDefault: without the flag, the manager does not dial what a
// Cluster's etcd-endpoints annotation names (etcdutil.DecideEndpoints); the flag is the one the
// Warning event names.
func TestEtcdEndpointsAnnotationIsOffByDefault(t *testing.T) {
	g := NewWithT(t)
	fs := pflag.NewFlagSet("defaults", pflag.ContinueOnError)
	o := &options{}
	o.bind(fs)
	g.Expect(fs.Parse(nil)).To(Succeed())
	g.Expect(o.allowEtcdEndpoints).To(BeFalse())
	f := fs.Lookup(strings.TrimPrefix(etcdutil.AllowEndpointsFlag, "--"))
	g.Expect(f).NotTo(BeNil(), "main.go defines no flag %s", etcdutil.AllowEndpointsFlag)
	g.Expect(f.DefValue).To(Equal("false"))
	g.Expect(fs.Parse([]string{etcdutil.AllowEndpointsFlag})).To(Succeed())
	g.Expect(o.allowEtcdEndpoints).To(BeTrue())
}
