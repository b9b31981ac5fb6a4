#!/bin/sh
# Run inside the node base image's build (hack/kind/node/Dockerfile): the steps of kind's
# images/base/Dockerfile that are not package installs, and two settings for hosts like CI's.
set -eu
chmod 0755 /kind /kind/bin /kind/bin/* /usr/local/bin/*
find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
	/lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
	/lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo ReadKMsg=no >>/etc/systemd/journald.conf
ln -sf /usr/lib/systemd/systemd /sbin/init
# kind's units run containerd from /usr/local/bin; Debian installs it in /usr/bin.
for p in containerd containerd-shim-runc-v2 ctr; do ln -sf /usr/bin/$p /usr/local/bin/$p; done
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service
mkdir -p /etc/kubernetes/manifests /opt/cni/bin
for p in host-local loopback ptp portmap; do cp /usr/lib/cni/$p /opt/cni/bin/; done
ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
	jq 'del(.process.rlimits)' >/etc/containerd/cri-base.json
# A host whose capability bounding set lacks CAP_SYS_RESOURCE (hack/kind/host.sh) gives the node's
# containerd none either, and runc then cannot lower a pod's oom_score_adj below containerd's own:
# every pod sandbox fails ("can't get final child's PID from pipe"). restrict_oom_score_adj clamps
# instead of failing; where the capability exists it changes nothing kubelet asks for in practice.
sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml
# kind's own node image runs containerd 2, whose CRI lets pods bind ports below 1024 without
# NET_BIND_SERVICE (enable_unprivileged_ports defaults to true there); Debian's containerd 1.6 has the
# setting off. CoreDNS runs as non-root and binds port 53: without it, it crash-loops.
sed -i 's/^\[plugins."io.containerd.grpc.v1.cri"\]$/&\n  enable_unprivileged_ports = true\n  enable_unprivileged_icmp = true/' /etc/containerd/config.toml
grep -q '^  enable_unprivileged_ports = true' /etc/containerd/config.toml
# kubelet >= 1.35 refuses to start on cgroup v1 unless told otherwise; on cgroup v2 the flag is a
# no-op. KUBELET_EXTRA_ARGS wins over the config files kubeadm and CABPK write.
echo 'KUBELET_EXTRA_ARGS=--runtime-cgroups=/system.slice/containerd.service --fail-cgroupv1=false' >/etc/default/kubelet
containerd --version
runc --version
