package v1alpha1_test

import (
	"strings"
	"testing"

	caprv1 "github.com/capr-io/capr/api/v1alpha1"
)

// TestMarkEntriesRoundTrip: every mark the health checker can write parses back to the same entries,
// including messages of several lines and lines that look like items.
func TestMarkEntriesRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries caprv1.MarkEntries
		message string
	}{
		{name: "one", entries: caprv1.MarkEntries{{Checker: "ns/a", Reason: "UnhealthyNode", Message: "Node n is not ready"}},
			message: "* ns/a (UnhealthyNode): Node n is not ready"},
		{name: "two, in order", entries: caprv1.MarkEntries{
			{Checker: "ns/b", Reason: "UnhealthyNode", Message: "Condition Ready on Node is reporting status Unknown"},
			{Checker: "ns/a", Reason: "ManualRequest", Message: "disk is failing"},
		}, message: "* ns/b (UnhealthyNode): Condition Ready on Node is reporting status Unknown\n* ns/a (ManualRequest): disk is failing"},
		{name: "no message", entries: caprv1.MarkEntries{{Checker: "ns/a", Reason: "NodeDeleted"}}, message: "* ns/a (NodeDeleted)"},
		{name: "message with lines that look like items", entries: caprv1.MarkEntries{
			{Checker: "ns/a", Reason: "ManualRequest", Message: "first\n* ns/b (X): not an item\n  indented"},
			{Checker: "ns/b", Reason: "UnhealthyMachine", Message: "x (y): z"},
		}, message: "* ns/a (ManualRequest): first\n  * ns/b (X): not an item\n    indented\n* ns/b (UnhealthyMachine): x (y): z"},
		{name: "message with the separators", entries: caprv1.MarkEntries{{Checker: "ns/a", Reason: "UnhealthyNode", Message: "): ( ) a (b): c"}},
			message: "* ns/a (UnhealthyNode): ): ( ) a (b): c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.entries.Marshal()
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if got != tc.message {
				t.Fatalf("Marshal = %q, want %q", got, tc.message)
			}
			back, err := caprv1.MarkEntriesFromMessage(got)
			if err != nil {
				t.Fatalf("caprv1.MarkEntriesFromMessage(%q): %v", got, err)
			}
			if len(back) != len(tc.entries) {
				t.Fatalf("caprv1.MarkEntriesFromMessage = %#v, want %#v", back, tc.entries)
			}
			for i := range back {
				if back[i] != tc.entries[i] {
					t.Fatalf("entry %d = %#v, want %#v", i, back[i], tc.entries[i])
				}
			}
		})
	}
}

// TestMarkEntriesErrors: a message that is not a list of entries (a mark written before marks named
// their health checks) and entries that would not parse back are errors that say what is wrong.
func TestMarkEntriesErrors(t *testing.T) {
	for _, tc := range []struct {
		message, wantErr string
	}{
		{message: "Condition Ready on Node is reporting status False", wantErr: "line 1"},
		{message: "", wantErr: "line 1"},
		{message: "* ns/a (UnhealthyNode): x\nplain", wantErr: "line 2"},
		{message: "  continuation first", wantErr: "line 1"},
		{message: "* ns/a UnhealthyNode: x", wantErr: "<namespace>/<name> (<reason>)"},
		{message: "* ns/a (UnhealthyNode: x", wantErr: "not closed"},
		{message: "* ns/a (): x", wantErr: "reason"},
		{message: "* (UnhealthyNode): x", wantErr: "<namespace>/<name>"},
		{message: "* ns/a b (UnhealthyNode): x", wantErr: "checker"},
		{message: "* ns/a (A): x\n* ns/a (B): y", wantErr: "two entries"},
	} {
		if _, err := caprv1.MarkEntriesFromMessage(tc.message); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("caprv1.MarkEntriesFromMessage(%q) = %v, want an error containing %q", tc.message, err, tc.wantErr)
		}
	}
	for _, tc := range []struct {
		entries caprv1.MarkEntries
		wantErr string
	}{
		{entries: nil, wantErr: "no entry"},
		{entries: caprv1.MarkEntries{{Checker: "", Reason: "R"}}, wantErr: "checker"},
		{entries: caprv1.MarkEntries{{Checker: "ns/a b", Reason: "R"}}, wantErr: "checker"},
		{entries: caprv1.MarkEntries{{Checker: "ns/a", Reason: ""}}, wantErr: "reason"},
		{entries: caprv1.MarkEntries{{Checker: "ns/a", Reason: "A)"}}, wantErr: "reason"},
		{entries: caprv1.MarkEntries{{Checker: "ns/a", Reason: "A"}, {Checker: "ns/a", Reason: "B"}}, wantErr: "two entries"},
	} {
		if _, err := tc.entries.Marshal(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%#v.Marshal() = %v, want an error containing %q", tc.entries, err, tc.wantErr)
		}
	}
}

// TestMarkEntriesWithAndWithout: With replaces a health check's entry in place or adds it last,
// Without removes only that health check's entry; neither changes the entries it is called on.
func TestMarkEntriesWithAndWithout(t *testing.T) {
	a := caprv1.MarkEntry{Checker: "ns/a", Reason: "UnhealthyNode", Message: "a"}
	b := caprv1.MarkEntry{Checker: "ns/b", Reason: "UnhealthyNode", Message: "b"}
	entries := caprv1.MarkEntries{a, b}
	a2 := caprv1.MarkEntry{Checker: "ns/a", Reason: "NodeDeleted", Message: "gone"}
	if got := entries.With(a2); len(got) != 2 || got[0] != a2 || got[1] != b {
		t.Errorf("With(a2) = %#v", got)
	}
	c := caprv1.MarkEntry{Checker: "ns/c", Reason: "ManualRequest"}
	if got := entries.With(c); len(got) != 3 || got[2] != c {
		t.Errorf("With(c) = %#v", got)
	}
	if got := entries.Without("ns/a"); len(got) != 1 || got[0] != b {
		t.Errorf("Without(ns/a) = %#v", got)
	}
	if got := entries.Without("ns/c"); len(got) != 2 {
		t.Errorf("Without(ns/c) = %#v", got)
	}
	if entries[0] != a || len(entries) != 2 {
		t.Errorf("entries changed: %#v", entries)
	}
}
