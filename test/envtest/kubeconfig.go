package envtest

import (
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeConfig returns a kubeconfig for a new user of the API server in the given groups (e.g.
// system:masters), for a process other than this one (the benchmark's controller processes).
func (e *Environment) KubeConfig(name string, groups []string) ([]byte, error) {
	user, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding user %s to the API server: %w", name, err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("writing the kubeconfig of user %s: %w", name, err)
	}
	return kubeconfig, nil
}
