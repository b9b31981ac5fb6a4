package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// allowlistFile is the reviewed list of every permission the rendered components grant, one rule a
// line. A grant added to the RBAC markers (or to config/rbac) is a visible diff of this file.
const allowlistFile = "testdata/rbac-allowlist.txt"

// TestRenderedRBACEqualsTheReviewedAllowlist: the roles in the rendered clusterctl components grant
// exactly what the allowlist says, rule by rule (the packaging test checked a list of
// permissions that must be denied, so a new grant nobody listed passed). Run with
// UPDATE_RBAC_ALLOWLIST=1 to rewrite the file after reviewing the change.
func TestRenderedRBACEqualsTheReviewedAllowlist(t *testing.T) {
	rendered, err := Components(root, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := rbacLines(rendered)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("UPDATE_RBAC_ALLOWLIST") != "" {
		if err := os.WriteFile(allowlistFile, []byte(strings.Join(got, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(allowlistFile)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Split(strings.TrimSpace(string(b)), "\n")
	added, removed := difference(got, want), difference(want, got)
	if len(added) > 0 || len(removed) > 0 {
		t.Errorf("the rendered RBAC differs from %s (review, then run UPDATE_RBAC_ALLOWLIST=1 go test ./hack/manifests):\n granted, not in the allowlist:\n  %s\n in the allowlist, not granted:\n  %s",
			filepath.Join("hack/manifests", allowlistFile), strings.Join(added, "\n  "), strings.Join(removed, "\n  "))
	}
}

// TestRBACLinesNameEveryVerb: the flattening the allowlist compares is per verb, resource and
// subresource, so adding one verb to an existing rule is one new line.
func TestRBACLinesNameEveryVerb(t *testing.T) {
	doc := `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: r}
rules:
- apiGroups: [cluster.x-k8s.io]
  resources: [machines, machines/status]
  verbs: [get, patch]
---
apiVersion: v1
kind: Namespace
metadata: {name: n}
`
	got, err := rbacLines([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ClusterRole r: cluster.x-k8s.io machines get",
		"ClusterRole r: cluster.x-k8s.io machines patch",
		"ClusterRole r: cluster.x-k8s.io machines/status get",
		"ClusterRole r: cluster.x-k8s.io machines/status patch",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// rbacLines flattens every Role and ClusterRole of a multi-document YAML into sorted lines
// "<Kind> <name>[ in <namespace>]: <group> <resource> [<names>] <verb>" (an aggregation selector is
// its own line: the rules it pulls in are other roles').
func rbacLines(docs []byte) ([]string, error) {
	var out []string
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(docs), 4096)
	for {
		var role struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
			Rules           []rbacv1.PolicyRule     `json:"rules"`
			AggregationRule *rbacv1.AggregationRule `json:"aggregationRule"`
		}
		if err := dec.Decode(&role); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		if role.Kind != "Role" && role.Kind != "ClusterRole" {
			continue
		}
		who := role.Kind + " " + role.Metadata.Name
		if role.Metadata.Namespace != "" {
			who += " in " + role.Metadata.Namespace
		}
		if role.AggregationRule != nil {
			for _, sel := range role.AggregationRule.ClusterRoleSelectors {
				out = append(out, fmt.Sprintf("%s: aggregates %v", who, sel.MatchLabels))
			}
		}
		for _, rule := range role.Rules {
			names := ""
			if len(rule.ResourceNames) > 0 {
				names = " " + strings.Join(rule.ResourceNames, ",")
			}
			for _, verb := range rule.Verbs {
				for _, url := range rule.NonResourceURLs {
					out = append(out, fmt.Sprintf("%s: url %s %s", who, url, verb))
				}
				for _, group := range rule.APIGroups {
					if group == "" {
						group = "core"
					}
					for _, res := range rule.Resources {
						out = append(out, fmt.Sprintf("%s: %s %s%s %s", who, group, res, names, verb))
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// difference returns the lines of a that are not in b.
func difference(a, b []string) []string {
	in := map[string]bool{}
	for _, l := range b {
		in[l] = true
	}
	var out []string
	for _, l := range a {
		if !in[l] {
			out = append(out, l)
		}
	}
	return out
}
