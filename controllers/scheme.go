package controllers

import (
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// NewScheme returns a scheme with the Kubernetes, CAPI core and CAPR types, plus any extra ones.
func NewScheme(extra ...func(*runtime.Scheme) error) (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	adders := append([]func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, clusterv1.AddToScheme, caprv1.AddToScheme,
	}, extra...)
	for _, add := range adders {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("building scheme: %w", err)
		}
	}
	return s, nil
}
