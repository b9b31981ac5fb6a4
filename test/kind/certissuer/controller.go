package certissuer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// cert-manager's API and annotations (cert-manager.io/v1).
var (
	CertificateGVK   = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Certificate"}
	IssuerGVK        = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "Issuer"}
	ClusterIssuerGVK = schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "ClusterIssuer"}
)

const (
	// InjectCAFrom names the Certificate (namespace/name) whose CA an object gets.
	InjectCAFrom = "cert-manager.io/inject-ca-from"
	// certificateNameAnnotation is what cert-manager writes on a Certificate's Secret.
	certificateNameAnnotation = "cert-manager.io/certificate-name"
	// retry is how soon an object that waits for something (an Issuer, a CA Secret) is looked at
	// again; nothing it waits for is watched.
	retry = 2 * time.Second
)

// Setup registers the issuer and the injector with mgr. clusterResourceNamespace is where a
// ClusterIssuer's ca Secret lives (cert-manager's --cluster-resource-namespace).
func Setup(mgr ctrl.Manager, clusterResourceNamespace string) error {
	cert := &unstructured.Unstructured{}
	cert.SetGroupVersionKind(CertificateGVK)
	secret := &corev1.Secret{}
	if err := ctrl.NewControllerManagedBy(mgr).Named("certificate").For(cert).
		Watches(secret, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if name := o.GetAnnotations()[certificateNameAnnotation]; name != "" {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
			}
			return nil
		})).
		Complete(&Issuer{Client: mgr.GetClient(), ClusterResourceNamespace: clusterResourceNamespace}); err != nil {
		return fmt.Errorf("setting up the certificate controller: %w", err)
	}
	annotated := builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
		_, ok := o.GetAnnotations()[InjectCAFrom]
		return ok
	}))
	for name, obj := range map[string]client.Object{
		"validatingwebhookconfiguration": &admissionregistrationv1.ValidatingWebhookConfiguration{},
		"mutatingwebhookconfiguration":   &admissionregistrationv1.MutatingWebhookConfiguration{},
		"customresourcedefinition":       &apiextensionsv1.CustomResourceDefinition{},
	} {
		if err := ctrl.NewControllerManagedBy(mgr).Named(name).For(obj, annotated).
			Complete(&Injector{Client: mgr.GetClient(), Kind: obj}); err != nil {
			return fmt.Errorf("setting up the %s injector: %w", name, err)
		}
	}
	return nil
}

// Issuer keeps each Certificate's Secret issued.
type Issuer struct {
	Client                   client.Client
	ClusterResourceNamespace string
	Now                      func() time.Time
}

func (r *Issuer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile issues the Certificate's Secret if it is missing or does not cover the Certificate, and
// sets the Certificate's Ready condition.
func (r *Issuer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	cert := &unstructured.Unstructured{}
	cert.SetGroupVersionKind(CertificateGVK)
	if err := r.Client.Get(ctx, req.NamespacedName, cert); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	spec, err := certificateSpec(cert)
	if err != nil {
		return ctrl.Result{}, r.setReady(ctx, cert, false, "BadSpec", err.Error())
	}
	sign, waiting, err := r.signer(ctx, cert.GetNamespace(), spec.issuerKind, spec.issuerName)
	if err != nil {
		return ctrl.Result{}, err
	}
	if waiting != "" {
		log.Info("waiting", "reason", waiting)
		return ctrl.Result{RequeueAfter: retry}, r.setReady(ctx, cert, false, "Pending", waiting)
	}
	secret := &corev1.Secret{}
	err = r.Client.Get(ctx, types.NamespacedName{Namespace: cert.GetNamespace(), Name: spec.secretName}, secret)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("reading Secret %s: %w", spec.secretName, err)
	}
	exists := err == nil
	if exists && Covers(secret.Data[corev1.TLSCertKey], secret.Data["ca.crt"], spec.request, r.now()) {
		return ctrl.Result{}, r.setReady(ctx, cert, true, "Ready", "Certificate is up to date and has not expired")
	}
	issued, err := sign(spec.request, r.now())
	if err != nil {
		return ctrl.Result{}, r.setReady(ctx, cert, false, "Failed", err.Error())
	}
	secret.Namespace, secret.Name, secret.Type = cert.GetNamespace(), spec.secretName, corev1.SecretTypeTLS
	if secret.Annotations == nil {
		secret.Annotations = map[string]string{}
	}
	secret.Annotations[certificateNameAnnotation] = cert.GetName()
	secret.Data = map[string][]byte{corev1.TLSCertKey: issued.Cert, corev1.TLSPrivateKeyKey: issued.Key, "ca.crt": issued.CA}
	if exists {
		err = r.Client.Update(ctx, secret)
	} else {
		err = r.Client.Create(ctx, secret)
	}
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("writing Secret %s: %w", spec.secretName, err)
	}
	log.Info("issued", "secret", spec.secretName, "dnsNames", spec.request.DNSNames)
	return ctrl.Result{}, r.setReady(ctx, cert, true, "Ready", "Certificate is up to date and has not expired")
}

type certSpec struct {
	secretName, issuerKind, issuerName string
	request                            Request
}

func certificateSpec(cert *unstructured.Unstructured) (certSpec, error) {
	var s certSpec
	s.secretName, _, _ = unstructured.NestedString(cert.Object, "spec", "secretName")
	s.issuerName, _, _ = unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	s.issuerKind, _, _ = unstructured.NestedString(cert.Object, "spec", "issuerRef", "kind")
	s.request.CommonName, _, _ = unstructured.NestedString(cert.Object, "spec", "commonName")
	s.request.DNSNames, _, _ = unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	s.request.IsCA, _, _ = unstructured.NestedBool(cert.Object, "spec", "isCA")
	switch {
	case s.secretName == "":
		return s, fmt.Errorf("spec.secretName is empty")
	case s.issuerName == "":
		return s, fmt.Errorf("spec.issuerRef.name is empty")
	case s.issuerKind == "":
		s.issuerKind = IssuerGVK.Kind
	}
	return s, nil
}

type signFunc func(Request, time.Time) (Issued, error)

// signer returns how the named issuer signs, or why it cannot yet.
func (r *Issuer) signer(ctx context.Context, namespace, kind, name string) (signFunc, string, error) {
	issuer := &unstructured.Unstructured{}
	key := types.NamespacedName{Namespace: namespace, Name: name}
	switch kind {
	case IssuerGVK.Kind:
		issuer.SetGroupVersionKind(IssuerGVK)
	case ClusterIssuerGVK.Kind:
		issuer.SetGroupVersionKind(ClusterIssuerGVK)
		key.Namespace = ""
	default:
		return nil, fmt.Sprintf("issuer kind %q is not served by this stand-in", kind), nil
	}
	if err := r.Client.Get(ctx, key, issuer); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("%s %s not found", kind, name), nil
		}
		return nil, "", fmt.Errorf("reading %s %s: %w", kind, name, err)
	}
	if _, ok, _ := unstructured.NestedMap(issuer.Object, "spec", "selfSigned"); ok {
		return SelfSigned, "", nil
	}
	caSecret, ok, _ := unstructured.NestedString(issuer.Object, "spec", "ca", "secretName")
	if !ok {
		return nil, fmt.Sprintf("%s %s is neither selfSigned nor ca, the only kinds this stand-in serves", kind, name), nil
	}
	ns := namespace
	if kind == ClusterIssuerGVK.Kind {
		ns = r.ClusterResourceNamespace
	}
	s := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: caSecret}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Sprintf("the CA Secret %s/%s of %s %s not found", ns, caSecret, kind, name), nil
		}
		return nil, "", fmt.Errorf("reading Secret %s/%s: %w", ns, caSecret, err)
	}
	caCert, caKey := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	return func(req Request, now time.Time) (Issued, error) { return SignedBy(req, now, caCert, caKey) }, "", nil
}

// setReady writes the Certificate's Ready condition if it changed.
func (r *Issuer) setReady(ctx context.Context, cert *unstructured.Unstructured, ready bool, reason, message string) error {
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	conds, _, _ := unstructured.NestedSlice(cert.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Ready" && m["status"] == string(status) && m["reason"] == reason {
			return nil
		}
	}
	patch := map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
		"type": "Ready", "status": string(status), "reason": reason, "message": message,
		"lastTransitionTime": r.now().UTC().Format(time.RFC3339), "observedGeneration": cert.GetGeneration(),
	}}}}
	raw, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encoding the status: %w", err)
	}
	if err := r.Client.Status().Patch(ctx, cert, client.RawPatch(types.MergePatchType, raw)); err != nil {
		return fmt.Errorf("writing the status of Certificate %s: %w", cert.GetName(), err)
	}
	return nil
}

// Injector writes the CA of the Certificate that an object's cert-manager.io/inject-ca-from names
// into the object's caBundle fields.
type Injector struct {
	Client client.Client
	// Kind is an empty object of the kind this injector serves.
	Kind client.Object
}

// Reconcile injects the CA, or waits for the Certificate's Secret.
func (r *Injector) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := r.Kind.DeepCopyObject().(client.Object)
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	from := obj.GetAnnotations()[InjectCAFrom]
	ns, name, ok := strings.Cut(from, "/")
	if !ok {
		ctrl.LoggerFrom(ctx).Info("ignored: the annotation is not namespace/name", InjectCAFrom, from)
		return ctrl.Result{}, nil
	}
	ca, err := r.caOf(ctx, ns, name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if ca == nil {
		return ctrl.Result{RequeueAfter: retry}, nil
	}
	patch, err := caBundlePatch(obj, ca)
	if err != nil || patch == nil {
		return ctrl.Result{}, err
	}
	if err := r.Client.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		return ctrl.Result{}, fmt.Errorf("injecting the CA of %s: %w", from, err)
	}
	ctrl.LoggerFrom(ctx).Info("injected", "from", from)
	return ctrl.Result{}, nil
}

// caOf returns the CA of the named Certificate's Secret, or nil while there is none.
func (r *Injector) caOf(ctx context.Context, ns, name string) ([]byte, error) {
	cert := &unstructured.Unstructured{}
	cert.SetGroupVersionKind(CertificateGVK)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cert); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	s := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: secretName}, s); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return s.Data["ca.crt"], nil
}

// caBundlePatch is a JSON patch that sets every caBundle of obj to ca, or nil if all already are.
func caBundlePatch(obj client.Object, ca []byte) ([]byte, error) {
	want := base64.StdEncoding.EncodeToString(ca)
	var ops []map[string]any
	set := func(path string, current []byte) {
		if string(current) != string(ca) {
			ops = append(ops, map[string]any{"op": "add", "path": path, "value": want})
		}
	}
	switch o := obj.(type) {
	case *admissionregistrationv1.ValidatingWebhookConfiguration:
		for i, w := range o.Webhooks {
			set(fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), w.ClientConfig.CABundle)
		}
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		for i, w := range o.Webhooks {
			set(fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), w.ClientConfig.CABundle)
		}
	case *apiextensionsv1.CustomResourceDefinition:
		if c := o.Spec.Conversion; c != nil && c.Strategy == apiextensionsv1.WebhookConverter && c.Webhook != nil && c.Webhook.ClientConfig != nil {
			set("/spec/conversion/webhook/clientConfig/caBundle", c.Webhook.ClientConfig.CABundle)
		}
	default:
		return nil, fmt.Errorf("kind %T has no caBundle this stand-in knows", obj)
	}
	if len(ops) == 0 {
		return nil, nil
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding the patch: %w", err)
	}
	return raw, nil
}
