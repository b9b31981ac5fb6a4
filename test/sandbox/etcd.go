package sandbox

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/capr-io/capr/etcdutil"

	capienv "github.com/capr-io/capr/test/envtest"
)

// EtcdCluster is a real etcd cluster of one process per member, as a workload cluster's stacked
// etcd: one member per control-plane Machine, named after the Machine's Node. Members join as
// learners and are promoted once caught up, like kubeadm. Clients use TLS with certificates from the
// cluster's CA, which is also stored in secret <cluster>-etcd for CAPR.
type EtcdCluster struct {
	dir    string
	binary string

	caCertPEM, caKeyPEM []byte
	caCert              *x509.Certificate
	caKey               *ecdsa.PrivateKey
	clientTLS           *tls.Config

	mu      sync.Mutex
	members map[string]*etcdProcess

	// provisioning serialises Provision: deciding "first member or join" and acting on it is one step,
	// so two Machines provisioned at once never both start a new cluster.
	provisioning sync.Mutex
}

type etcdProcess struct {
	name                 string
	clientPort, peerPort int
	dir                  string
	cmd                  *exec.Cmd
	exited               chan struct{}
}

// NewEtcdCluster prepares an empty cluster whose data lives under dir, with a fresh CA.
func NewEtcdCluster(dir, binary string) (*EtcdCluster, error) {
	if _, err := os.Stat(binary); err != nil {
		return nil, fmt.Errorf("etcd binary %s is missing: run `make envtest-assets`", binary)
	}
	c := &EtcdCluster{dir: dir, binary: binary, members: map[string]*etcdProcess{}}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	c.caCert, _ = x509.ParseCertificate(der)
	c.caKey = key
	c.caCertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	c.caKeyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), c.caCertPEM, 0o600); err != nil {
		return nil, err
	}
	serverCert, serverKey, err := c.signServerCert()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "server.crt"), serverCert, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "server.key"), serverKey, 0o600); err != nil {
		return nil, err
	}
	clientCert, err := etcdutil.NewClientCertificate(c.caCertPEM, c.caKeyPEM, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	c.clientTLS, err = etcdutil.TLSConfig(c.caCertPEM, clientCert)
	return c, err
}

// signServerCert issues the members' serving certificate (client and peer), for 127.0.0.1.
func (c *EtcdCluster) signServerCert() ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "etcd"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.caCert, key.Public(), c.caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// CA returns the cluster's CA certificate and key (PEM), as stored in secret <cluster>-etcd.
func (c *EtcdCluster) CA() (certPEM, keyPEM []byte) { return c.caCertPEM, c.caKeyPEM }

// ClientTLS returns a client TLS config trusted by the members.
func (c *EtcdCluster) ClientTLS() *tls.Config { return c.clientTLS }

// Endpoint returns the client address (host:port) of a member, or "" when unknown.
func (c *EtcdCluster) Endpoint(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.members[name]; ok {
		return fmt.Sprintf("127.0.0.1:%d", p.clientPort)
	}
	return ""
}

// Endpoints returns name → host:port for every member process the sandbox started (running or not).
func (c *EtcdCluster) Endpoints() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for n, p := range c.members {
		out[n] = fmt.Sprintf("127.0.0.1:%d", p.clientPort)
	}
	return out
}

// Direct returns a Connector that reaches the members at their real addresses (the ground truth,
// independent of kubelets and port-forwarding).
func (c *EtcdCluster) Direct() *etcdutil.Direct {
	return &etcdutil.Direct{Endpoints: c.Endpoints(), TLS: c.clientTLS, DialTimeout: 2 * time.Second}
}

// Running reports whether the member's process is running.
func (c *EtcdCluster) Running(name string) bool {
	c.mu.Lock()
	p, ok := c.members[name]
	c.mu.Unlock()
	if !ok || p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Diagnose describes every member process the sandbox started (ports, running or how it exited,
// the end of its log), for the error of a cluster that did not come up: the data directory of a
// destroyed cluster is deleted with it.
func (c *EtcdCluster) Diagnose() string {
	c.mu.Lock()
	procs := make([]*etcdProcess, 0, len(c.members))
	for _, p := range c.members {
		procs = append(procs, p)
	}
	c.mu.Unlock()
	sort.Slice(procs, func(i, j int) bool { return procs[i].name < procs[j].name })
	var b strings.Builder
	for _, p := range procs {
		state := "running"
		select {
		case <-p.exited: // closed after Wait returned: ProcessState is set
			state = "exited (" + p.cmd.ProcessState.String() + ")"
		default:
		}
		fmt.Fprintf(&b, "\n  %s: client port %d, peer port %d, %s; log: %s", p.name, p.clientPort, p.peerPort, state,
			logTail(filepath.Join(p.dir, "etcd.log"), 5))
	}
	return b.String()
}

// logTail returns the last n lines of a file, joined with " | ".
func logTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Client returns a client to every running member.
func (c *EtcdCluster) Client(ctx context.Context) (*clientv3.Client, error) {
	c.mu.Lock()
	eps := make([]string, 0, len(c.members))
	for _, p := range c.members {
		eps = append(eps, fmt.Sprintf("127.0.0.1:%d", p.clientPort))
	}
	c.mu.Unlock()
	if len(eps) == 0 {
		return nil, errors.New("etcd cluster has no member")
	}
	return clientv3.New(clientv3.Config{Context: ctx, Endpoints: eps, TLS: c.clientTLS, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
}

func (c *EtcdCluster) newProcess(name string) (*etcdProcess, error) {
	ports, err := capienv.FreePorts(2)
	if err != nil {
		return nil, err
	}
	p := &etcdProcess{name: name, clientPort: ports[0], peerPort: ports[1], dir: filepath.Join(c.dir, name)}
	return p, nil
}

func (p *etcdProcess) peerURL() string { return fmt.Sprintf("http://127.0.0.1:%d", p.peerPort) }

// start runs the member with the given initial cluster.
func (c *EtcdCluster) start(p *etcdProcess, initialCluster, state string) error {
	clientURL := fmt.Sprintf("https://127.0.0.1:%d", p.clientPort)
	args := []string{
		"--name", p.name, "--data-dir", filepath.Join(p.dir, "data"),
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", p.peerURL(), "--initial-advertise-peer-urls", p.peerURL(),
		"--initial-cluster", initialCluster, "--initial-cluster-state", state,
		"--initial-cluster-token", "sandbox",
		"--cert-file", filepath.Join(c.dir, "server.crt"), "--key-file", filepath.Join(c.dir, "server.key"),
		"--client-cert-auth", "--trusted-ca-file", filepath.Join(c.dir, "ca.crt"),
		// Fast elections keep the sandbox quick; the quorum rules are the same.
		"--heartbeat-interval", "50", "--election-timeout", "500",
		"--log-level", "error", "--snapshot-count", "10000",
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(p.dir, "etcd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("starting etcd member %s: %w", p.name, err)
	}
	p.cmd = cmd
	p.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(p.exited)
	}()
	c.mu.Lock()
	c.members[p.name] = p
	c.mu.Unlock()
	return nil
}

// Provision gives a control-plane Node its etcd member: nothing when it has one, the first member of a
// new cluster when there is no member yet, else a join. Calls are serialised; without that, two
// Machines provisioned at once both saw no member and started two separate one-member clusters
// (seen in CI: three member processes, one voting member in any member list). starting, when set, is
// told which of the two is about to happen; first reports whether this call started the cluster.
func (c *EtcdCluster) Provision(ctx context.Context, name string, starting func(first bool)) (first bool, err error) {
	c.provisioning.Lock()
	defer c.provisioning.Unlock()
	if c.Endpoint(name) != "" {
		return false, nil
	}
	first = len(c.Endpoints()) == 0
	if starting != nil {
		starting(first)
	}
	if first {
		return true, c.StartFirst(ctx, name)
	}
	return false, c.Join(ctx, name)
}

// StartFirst starts the first member of a new cluster.
func (c *EtcdCluster) StartFirst(ctx context.Context, name string) error {
	p, err := c.newProcess(name)
	if err != nil {
		return err
	}
	if err := c.start(p, fmt.Sprintf("%s=%s", name, p.peerURL()), "new"); err != nil {
		return err
	}
	return c.waitHealthy(ctx, name)
}

// Join adds a member as a learner, starts it, and promotes it once it has caught up (kubeadm's
// learner mode). The learner shows up in the member list before it votes, exactly as in a real join.
func (c *EtcdCluster) Join(ctx context.Context, name string) error {
	p, err := c.newProcess(name)
	if err != nil {
		return err
	}
	cli, err := c.Client(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	// etcd refuses membership changes until every voter has been connected for a few seconds
	// ("unhealthy cluster"), e.g. right after the previous join: retry, as kubeadm does.
	var added *clientv3.MemberAddResponse
	if err := retryUntil(ctx, 60*time.Second, func() error {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		added, err = cli.MemberAddAsLearner(actx, []string{p.peerURL()})
		return err
	}); err != nil {
		return fmt.Errorf("adding learner %s: %w", name, err)
	}
	var initial []string
	for _, m := range added.Members {
		n := m.Name
		if m.ID == added.Member.ID {
			n = name
		}
		if n == "" || len(m.PeerURLs) == 0 {
			continue
		}
		initial = append(initial, fmt.Sprintf("%s=%s", n, m.PeerURLs[0]))
	}
	if err := c.start(p, strings.Join(initial, ","), "existing"); err != nil {
		return errors.Join(err, c.abandonJoin(ctx, cli, p, added.Member.ID))
	}
	// Promote as soon as etcd accepts it (it refuses while the learner is behind).
	if err := retryUntil(ctx, 60*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cli.MemberPromote(pctx, added.Member.ID)
		if errors.Is(err, rpctypes.ErrMemberNotLearner) {
			return nil // promoted by an earlier try whose answer was lost
		}
		return err
	}); err != nil {
		return errors.Join(fmt.Errorf("promoting learner %s: %w", name, err), c.abandonJoin(ctx, cli, p, added.Member.ID))
	}
	return nil
}

// abandonJoin undoes a join that failed half-way (a learner that never caught up, e.g. because its
// process died on a port taken in the meantime): it stops the process, removes the learner and its
// data, so the provider's next attempt joins from scratch instead of finding a running member that
// stays a learner forever (what `kubeadm reset` after a failed join does).
func (c *EtcdCluster) abandonJoin(ctx context.Context, cli *clientv3.Client, p *etcdProcess, id uint64) error {
	// Removed first (a learner does not count for quorum, so this never needs it), then stopped; even
	// when the caller's context ended, or a learner would stay behind and block the next join (etcd
	// allows one learner at a time).
	ctx = context.WithoutCancel(ctx)
	err := retryUntil(ctx, 30*time.Second, func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := cli.MemberRemove(rctx, id)
		if errors.Is(err, rpctypes.ErrMemberNotFound) {
			return nil
		}
		return err
	})
	c.Kill(p.name)
	c.mu.Lock()
	delete(c.members, p.name)
	c.mu.Unlock()
	if rmErr := os.RemoveAll(p.dir); rmErr != nil {
		err = errors.Join(err, rmErr)
	}
	if err != nil {
		return fmt.Errorf("abandoning the join of %s: %w", p.name, err)
	}
	return nil
}

// retryUntil calls f every 100ms until it succeeds, the timeout passes or ctx ends.
func retryUntil(ctx context.Context, timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Kill stops a member's process abruptly (SIGKILL); its membership stays, as with a crashed etcd.
func (c *EtcdCluster) Kill(name string) {
	c.mu.Lock()
	p, ok := c.members[name]
	c.mu.Unlock()
	if !ok || p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// Freeze stops a member's process without ending it (SIGSTOP), as `docker pause` freezes a node: the
// kernel keeps its sockets, so its peers' connections to it stay open and writes to them succeed
// until their buffers fill, but it neither reads, answers nor votes. Thaw resumes it.
func (c *EtcdCluster) Freeze(name string) { c.signal(name, syscall.SIGSTOP) }

// Thaw resumes a frozen member's process (SIGCONT).
func (c *EtcdCluster) Thaw(name string) { c.signal(name, syscall.SIGCONT) }

func (c *EtcdCluster) signal(name string, sig syscall.Signal) {
	c.mu.Lock()
	p, ok := c.members[name]
	c.mu.Unlock()
	if !ok || p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Restart starts a killed member's process again, as its node's boot would: same name, ports and data
// directory, so it rejoins with its membership and data (etcd ignores the initial cluster when the
// data directory holds a WAL). It does not wait for the member to be healthy: without a quorum to
// rejoin it never is. A member that runs is left alone.
func (c *EtcdCluster) Restart(name string) error {
	c.mu.Lock()
	old, ok := c.members[name]
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("restarting etcd member %s: the sandbox never started it", name)
	}
	if c.Running(name) {
		return nil
	}
	// A new process record: Running reads the old one's fields without the lock.
	p := &etcdProcess{name: name, clientPort: old.clientPort, peerPort: old.peerPort, dir: old.dir}
	return c.start(p, fmt.Sprintf("%s=%s", name, p.peerURL()), "existing")
}

// Leave is what `kubeadm reset` does on a control-plane node: remove the member if it is still in the
// list (through another member), then stop it.
func (c *EtcdCluster) Leave(ctx context.Context, name string) error {
	defer c.Kill(name)
	cli, err := c.Client(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	return retryUntil(ctx, 30*time.Second, func() error {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		list, err := cli.MemberList(lctx)
		if err != nil {
			return fmt.Errorf("member list: %w", err)
		}
		for _, m := range list.Members {
			if m.Name == name && len(list.Members) > 1 {
				if _, err := cli.MemberRemove(lctx, m.ID); err != nil {
					return fmt.Errorf("removing member %s: %w", name, err)
				}
			}
		}
		return nil
	})
}

// ActivateAlarm raises an alarm (NOSPACE, CORRUPT) for one member through etcd's Maintenance Alarm
// RPC, as etcd itself does when a member's backend exceeds its quota (server/etcdserver/server.go,
// "exceeded backend quota; raising alarm"). The member's process keeps running and answering. The
// alarm goes through raft, so every member lists it; a NOSPACE alarm caps the whole cluster (every
// member rejects puts, server/etcdserver/apply/uber_applier.go restoreAlarms) until it is disarmed,
// and etcd keeps it when the member is removed.
func (c *EtcdCluster) ActivateAlarm(ctx context.Context, name string, alarm pb.AlarmType) error {
	cli, err := c.Client(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cli.Close() }()
	return retryUntil(ctx, 30*time.Second, func() error {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		list, err := cli.MemberList(actx)
		if err != nil {
			return fmt.Errorf("member list: %w", err)
		}
		for _, m := range list.Members {
			if m.Name != name {
				continue
			}
			req := &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, Alarm: alarm, MemberID: m.ID}
			if _, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(actx, req); err != nil {
				return fmt.Errorf("activating alarm %s for member %s: %w", alarm, name, err)
			}
			return nil
		}
		return fmt.Errorf("activating alarm %s: no member %s in the member list", alarm, name)
	})
}

// Stop kills every member and deletes their data.
func (c *EtcdCluster) Stop() {
	c.mu.Lock()
	names := make([]string, 0, len(c.members))
	for n := range c.members {
		names = append(names, n)
	}
	c.mu.Unlock()
	for _, n := range names {
		c.Kill(n)
	}
	// The members' data (a 64 MB WAL each) is not needed once the cluster is stopped.
	_ = os.RemoveAll(c.dir)
}

func (c *EtcdCluster) waitHealthy(ctx context.Context, name string) error {
	d := c.Direct()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cli, err := d.Connect(ctx, name)
		if err == nil {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err = cli.Get(sctx, "health")
			cancel()
			_ = cli.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd member %s did not become healthy: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
