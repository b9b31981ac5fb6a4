package envtest

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
)

// capiWebhookManifests are the admission webhook configurations CAPI ships for its three managers
// (core, kubeadm bootstrap, KubeadmControlPlane), relative to the sigs.k8s.io/cluster-api module.
var capiWebhookManifests = map[string]string{
	"core":      filepath.Join("core", "config", "webhook", "manifests.yaml"),
	"bootstrap": filepath.Join("bootstrap", "kubeadm", "config", "webhook", "manifests.yaml"),
	"cp":        filepath.Join("controlplane", "kubeadm", "config", "webhook", "manifests.yaml"),
}

// capiWebhookInstallOptions reads CAPI's webhook manifests from the module so that the API server
// calls CAPI's real admission handlers (served by the manager given WebhookServerOptions). The three
// manifests use the same configuration names (kustomize prefixes them in a release), so each is
// suffixed with its manager's tag here.
func capiWebhookInstallOptions(capiDir string) (envtest.WebhookInstallOptions, error) {
	opts := envtest.WebhookInstallOptions{MaxTime: 20 * time.Second, PollInterval: 200 * time.Millisecond}
	for tag, rel := range capiWebhookManifests {
		raw, err := os.ReadFile(filepath.Join(capiDir, rel))
		if err != nil {
			return opts, fmt.Errorf("reading CAPI's webhook manifest %s: %w", rel, err)
		}
		objs, err := utilyaml.ToUnstructured(raw)
		if err != nil {
			return opts, fmt.Errorf("parsing CAPI's webhook manifest %s: %w", rel, err)
		}
		for i := range objs {
			o := &objs[i]
			o.SetName(o.GetName() + "-" + tag)
			b, err := o.MarshalJSON()
			if err != nil {
				return opts, err
			}
			switch o.GetKind() {
			case "MutatingWebhookConfiguration":
				w := &admissionv1.MutatingWebhookConfiguration{}
				if err := yaml.Unmarshal(b, w); err != nil {
					return opts, fmt.Errorf("decoding %s from %s: %w", o.GetName(), rel, err)
				}
				opts.MutatingWebhooks = append(opts.MutatingWebhooks, w)
			case "ValidatingWebhookConfiguration":
				w := &admissionv1.ValidatingWebhookConfiguration{}
				if err := yaml.Unmarshal(b, w); err != nil {
					return opts, fmt.Errorf("decoding %s from %s: %w", o.GetName(), rel, err)
				}
				opts.ValidatingWebhooks = append(opts.ValidatingWebhooks, w)
			}
		}
	}
	return opts, nil
}

// WebhookServerOptions returns where the API server expects the admission webhooks installed with
// Options.CAPIWebhooks: a manager built with webhook.NewServer(env.WebhookServerOptions()) serves them.
func (e *Environment) WebhookServerOptions() webhook.Options {
	w := e.env.WebhookInstallOptions
	return webhook.Options{Host: w.LocalServingHost, Port: w.LocalServingPort, CertDir: w.LocalServingCertDir}
}
