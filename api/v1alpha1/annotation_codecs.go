package v1alpha1

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Each annotation format has exactly one codec here: a parse function and a Marshal method, in the
// style of KCP's RemediationDataFromAnnotation and RemediationData.Marshal
// (sigs.k8s.io/cluster-api controlplane/kubeadm/reconcilers/kubeadmcontrolplane/remediation.go).
// The health checker and the remediators use nothing else to read or write these annotations.

// MarkRecordFromAnnotation parses the value of UnhealthyAnnotation.
func MarkRecordFromAnnotation(value string) (*MarkRecord, error) {
	rec := &MarkRecord{}
	if err := json.Unmarshal([]byte(value), rec); err != nil {
		return nil, fmt.Errorf("unmarshalling value %q of annotation %s: %w", value, UnhealthyAnnotation, err)
	}
	if err := checkTimestamp(rec.Since); err != nil {
		return nil, fmt.Errorf("value %q of annotation %s: since %w", value, UnhealthyAnnotation, err)
	}
	return rec, nil
}

// Marshal returns the value of UnhealthyAnnotation for this record.
func (r *MarkRecord) Marshal() (string, error) {
	if r.Reason == "" {
		return "", errors.New("marshalling the mark: reason must not be empty")
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("marshalling the mark: %w", err)
	}
	return string(b), nil
}

// RemediationRecordFromAnnotation parses the value of RemediationRecordAnnotation.
func RemediationRecordFromAnnotation(value string) (*RemediationRecord, error) {
	rec := &RemediationRecord{}
	if err := json.Unmarshal([]byte(value), rec); err != nil {
		return nil, fmt.Errorf("unmarshalling value %q of annotation %s: %w", value, RemediationRecordAnnotation, err)
	}
	if rec.Machine == "" {
		return nil, fmt.Errorf("value %q of annotation %s: machine must not be empty", value, RemediationRecordAnnotation)
	}
	if rec.RetryCount < 0 {
		return nil, fmt.Errorf("value %q of annotation %s: retryCount must not be negative", value, RemediationRecordAnnotation)
	}
	if err := checkTimestamp(rec.Timestamp); err != nil {
		return nil, fmt.Errorf("value %q of annotation %s: timestamp %w", value, RemediationRecordAnnotation, err)
	}
	return rec, nil
}

// Marshal returns the value of RemediationRecordAnnotation for this record.
func (r *RemediationRecord) Marshal() (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("marshalling the remediation record of Machine %s: %w", r.Machine, err)
	}
	return string(b), nil
}

// ControlPlaneLockFromAnnotation parses the value of ControlPlaneLockAnnotation.
func ControlPlaneLockFromAnnotation(value string) (*ControlPlaneLock, error) {
	l := &ControlPlaneLock{}
	if err := json.Unmarshal([]byte(value), l); err != nil {
		return nil, fmt.Errorf("unmarshalling value %q of annotation %s: %w", value, ControlPlaneLockAnnotation, err)
	}
	if l.MachineRemediation == "" {
		return nil, fmt.Errorf("value %q of annotation %s: machineRemediation must not be empty", value, ControlPlaneLockAnnotation)
	}
	if l.DesiredReplicas < 0 {
		return nil, fmt.Errorf("value %q of annotation %s: desiredReplicas must not be negative", value, ControlPlaneLockAnnotation)
	}
	return l, nil
}

// Marshal returns the value of ControlPlaneLockAnnotation for this lock.
func (l *ControlPlaneLock) Marshal() (string, error) {
	b, err := json.Marshal(l)
	if err != nil {
		return "", fmt.Errorf("marshalling the control-plane lock of %s: %w", l.MachineRemediation, err)
	}
	return string(b), nil
}

// The mark's entries (MarkEntries) are the message of MachineCAPRHealthCheckSucceededCondition at
// False, a list in the style of CAPI's condition messages (sigs.k8s.io/cluster-api
// util/conditions/merge_strategies.go: items start with "* ", their further lines are indented by
// two spaces), one item per health check: "* <namespace>/<name> (<reason>): <message>", each further
// line of the message on a line of its own after "  ". A health check's name has no space, and a
// reason neither a space nor ')': the first " (" and the first "): " of an item separate its fields.
// The message keeps its lines but not its trailing newlines.
const (
	markItemPrefix         = "* "
	markContinuationPrefix = "  "
)

// MarkEntriesFromMessage parses the message of MachineCAPRHealthCheckSucceededCondition at False. A
// message of another form (a mark written before marks named their health checks) is an error.
func MarkEntriesFromMessage(message string) (MarkEntries, error) {
	var out MarkEntries
	for i, line := range strings.Split(message, "\n") {
		if rest, ok := strings.CutPrefix(line, markContinuationPrefix); ok && len(out) > 0 {
			out[len(out)-1].Message += "\n" + rest
			continue
		}
		item, ok := strings.CutPrefix(line, markItemPrefix)
		if !ok {
			return nil, fmt.Errorf("line %d of the message of condition %s: want %q or, after one, %q: %q", i+1,
				MachineCAPRHealthCheckSucceededCondition, markItemPrefix+"<namespace>/<name> (<reason>): <message>", markContinuationPrefix+"<more message>", line)
		}
		checker, rest, ok := strings.Cut(item, " (")
		if !ok {
			return nil, fmt.Errorf("line %d of the message of condition %s: want \"<namespace>/<name> (<reason>)\" after %q: %q", i+1,
				MachineCAPRHealthCheckSucceededCondition, markItemPrefix, line)
		}
		reason, msg, hasMessage := strings.Cut(rest, "): ")
		if !hasMessage {
			var closed bool
			reason, closed = strings.CutSuffix(rest, ")")
			if !closed {
				return nil, fmt.Errorf("line %d of the message of condition %s: the reason is not closed by \")\": %q", i+1,
					MachineCAPRHealthCheckSucceededCondition, line)
			}
		}
		entry := MarkEntry{Checker: checker, Reason: reason, Message: msg}
		if err := entry.validate(); err != nil {
			return nil, fmt.Errorf("line %d of the message of condition %s: %w", i+1, MachineCAPRHealthCheckSucceededCondition, err)
		}
		if out.Index(checker) >= 0 {
			return nil, fmt.Errorf("line %d of the message of condition %s: checker %q has two entries", i+1, MachineCAPRHealthCheckSucceededCondition, checker)
		}
		out = append(out, entry)
	}
	return out, nil
}

// Marshal returns the message of MachineCAPRHealthCheckSucceededCondition for these entries.
func (e MarkEntries) Marshal() (string, error) {
	if len(e) == 0 {
		return "", errors.New("marshalling the mark: no entry")
	}
	var b strings.Builder
	for i, entry := range e {
		if err := entry.validate(); err != nil {
			return "", fmt.Errorf("marshalling the mark: entry %d: %w", i, err)
		}
		if e[:i].Index(entry.Checker) >= 0 {
			return "", fmt.Errorf("marshalling the mark: checker %q has two entries", entry.Checker)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(markItemPrefix + entry.Checker + " (" + entry.Reason + ")")
		// All trailing newlines go, not one: "m\n\n" written as "m\n  " would read back as "m\n"
		// and be written as "m", so a health check rewriting another's entry would change its text
		// and the two would rewrite the Machine's status in turn without end (found by
		// FuzzMarkEntriesFromMessage).
		if msg := strings.TrimRight(entry.Message, "\n"); msg != "" {
			b.WriteString(": " + strings.ReplaceAll(msg, "\n", "\n"+markContinuationPrefix))
		}
	}
	return b.String(), nil
}

// validate checks what makes an entry parse back: a checker without spaces or " (" and a reason
// without spaces or ')'.
func (e MarkEntry) validate() error {
	switch {
	case e.Checker == "" || strings.ContainsAny(e.Checker, " \t\n") || strings.Contains(e.Checker, "("):
		return fmt.Errorf("checker %q must be a non-empty <namespace>/<name>", e.Checker)
	case e.Reason == "" || strings.ContainsAny(e.Reason, " \t\n)"):
		return fmt.Errorf("reason %q of checker %s must be non-empty, without spaces or \")\"", e.Reason, e.Checker)
	}
	return nil
}

// checkTimestamp refuses a time that metav1.Time would write back as text it cannot parse: it
// parses any RFC 3339 offset but writes UTC with time.RFC3339, whose year has four digits, so
// "9999-12-31T23:59:59-01:00" would come back as year 10000 (k8s.io/apimachinery
// pkg/apis/meta/v1/time.go MarshalJSON). Found by FuzzMarkRecordFromAnnotation.
func checkTimestamp(t metav1.Time) error {
	if y := t.UTC().Year(); !t.IsZero() && (y < 0 || y > 9999) {
		return fmt.Errorf("%s is outside years 0000-9999 in UTC", t.UTC().Format(time.RFC3339))
	}
	return nil
}

// EtcdLearnerJoinsFromAnnotation parses the value of EtcdLearnerJoinsAnnotation: "true" or "false".
func EtcdLearnerJoinsFromAnnotation(value string) (bool, error) {
	switch value {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("value %q of annotation %s: want \"true\" or \"false\"", value, EtcdLearnerJoinsAnnotation)
}
