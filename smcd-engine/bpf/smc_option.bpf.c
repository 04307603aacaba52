/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The kernel's SMC TCP option, from user space: a cgroup sock_ops program that puts
 * kind 254, length 6, magic E2 D4 C3 D9 (TCPOPT_SMC_MAGIC) into the SYN of a socket user
 * space marked as an SMC client (the kernel's tp->syn_smc), echoes it in the SYN-ACK only when
 * the SYN had it and the listener is a registered SMC listener that is not congested (the
 * kernel's ireq->smc_ok, decided once per request in tcp_openreq_init, and smc_hs_congested),
 * and records in socket storage what each side saw, so each knows before the first byte
 * whether CLC runs. See docs/syn-option.md; the Rust side is smcd-engine/src/bpf/.
 *
 * Build: smcd-engine/bpf/build.sh (the committed .bpf.o must be what it makes).
 */
#include "smc_bpf.h"

/* Must match smcd-engine/src/bpf/mod.rs. */
#define SMC_SK_CLIENT 0x01        /* user space: propose SMC on this socket's SYN */
#define SMC_SK_SYN_OPT_SENT 0x02  /* our SYN carried the option */
#define SMC_SK_PEER_OPT 0x04      /* client: the SYN-ACK had it; server: the SYN had it */
#define SMC_SK_ECHOED 0x08        /* server: our SYN-ACK carried it */
#define SMC_SK_ESTABLISHED 0x10   /* the program saw the handshake end: the flags are final */
#define SMC_SK_PASSIVE 0x20       /* an accepted connection of a registered listener */

#define SMC_LISTENER_CONGESTED 0x01

/* TCPOPT_EXP, TCPOLEN_EXP_SMC_BASE, TCPOPT_SMC_MAGIC (include/net/tcp.h) */
#define SMC_OPT_LEN 6

struct smc_opt {
	__u8 kind;
	__u8 len;
	__u8 magic[4];
};

struct smc_sk_state {
	__u32 flags;
	__u32 reserved;
};

/* An SMC listener: its namespace, local address (IPv4 as ::ffff:a.b.c.d; a wildcard is
 * ::ffff:0.0.0.0 or ::) and port (host order). */
struct smc_listener_key {
	__u64 netns_cookie;
	__u8 addr[16];
	__u32 port;
	__u32 reserved;
};

struct smc_listener_val {
	__u32 flags;
	__u32 reserved;
};

/* One connection request that carried the option to a registered listener: the decision
 * taken at its first SYN-ACK, kept until the handshake ends (or the LRU drops it). */
struct smc_req_key {
	__u64 netns_cookie;
	__u8 laddr[16];
	__u8 raddr[16];
	__u32 lport;     /* host order, as skops->local_port */
	__u32 rport;     /* as skops->remote_port */
	__u32 isn;       /* the client's initial sequence number */
	__u32 reserved;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct smc_sk_state);
} smc_sk SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct smc_listener_key);
	__type(value, struct smc_listener_val);
} smc_listeners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct smc_req_key);
	__type(value, __u32);
} smc_reqs SEC(".maps");

static __always_inline void smc_opt_init(struct smc_opt *o)
{
	o->kind = TCPOPT_EXP;
	o->len = SMC_OPT_LEN;
	o->magic[0] = 0xe2;
	o->magic[1] = 0xd4;
	o->magic[2] = 0xc3;
	o->magic[3] = 0xd9;
}

/* Whether the packet (or, with BPF_LOAD_HDR_OPT_TCP_SYN, the SYN) carries the SMC option.
 * The kernel searches kind 254 by its first two magic bytes; the other two are checked here. */
static __always_inline int has_smc_opt(struct bpf_sock_ops *skops, __u64 flags)
{
	struct smc_opt o;

	smc_opt_init(&o);
	if (bpf_load_hdr_opt(skops, &o, sizeof(o), flags) != SMC_OPT_LEN)
		return 0;
	return o.magic[2] == 0xc3 && o.magic[3] == 0xd9;
}

/* TCP Fast Open in the SYN (kind 34, or 254 with magic F9 89): the kernel's SMC never
 * combines the two (a client falls back with OPTUNSUPP), so such a request is not echoed. */
static __always_inline int has_tfo(struct bpf_sock_ops *skops)
{
	__u8 buf[4] = { TCPOPT_FASTOPEN, 0, 0, 0 };
	__u8 exp[4] = { TCPOPT_EXP, 4, 0xf9, 0x89 };

	/* Found: the option's length (or -ENOSPC when it is longer than buf); absent: -ENOMSG. */
	long r = bpf_load_hdr_opt(skops, buf, sizeof(buf), BPF_LOAD_HDR_OPT_TCP_SYN);

	if (r > 0 || r == -28 /* ENOSPC */)
		return 1;
	r = bpf_load_hdr_opt(skops, exp, sizeof(exp), BPF_LOAD_HDR_OPT_TCP_SYN);
	return r > 0 || r == -28;
}

/* Context fields are read with constant offsets one by one: the verifier refuses a load
 * through a context pointer the compiler moved (as it does when it shares the load of
 * local_ip4 and local_ip6[i] between two branches). */
#define CTX(field) (*(volatile __u32 *)&(field))

/* An address as 16 bytes (IPv4 mapped, as a dual-stack socket sees it), so a request and the
 * socket it becomes give the same key. */
static __always_inline void addr16(__u32 family, __u32 ip4, __u32 a0, __u32 a1, __u32 a2,
				   __u32 a3, __u8 *a)
{
	__u32 *w = (__u32 *)a;

	if (family == AF_INET) {
		w[0] = 0;
		w[1] = 0;
		w[2] = 0xffff0000; /* bytes 00 00 ff ff on little endian */
		w[3] = ip4;
	} else {
		w[0] = a0;
		w[1] = a1;
		w[2] = a2;
		w[3] = a3;
	}
}

static __always_inline void local_addr(struct bpf_sock_ops *skops, __u8 *a)
{
	addr16(CTX(skops->family), CTX(skops->local_ip4), CTX(skops->local_ip6[0]),
	       CTX(skops->local_ip6[1]), CTX(skops->local_ip6[2]), CTX(skops->local_ip6[3]), a);
}

static __always_inline void remote_addr(struct bpf_sock_ops *skops, __u8 *a)
{
	addr16(CTX(skops->family), CTX(skops->remote_ip4), CTX(skops->remote_ip6[0]),
	       CTX(skops->remote_ip6[1]), CTX(skops->remote_ip6[2]), CTX(skops->remote_ip6[3]),
	       a);
}

static __always_inline int is_v4_mapped(const __u8 *a)
{
	const __u32 *w = (const __u32 *)a;

	return w[0] == 0 && w[1] == 0 && w[2] == 0xffff0000;
}

/* The registered SMC listener this connection arrives at: the exact address first, then the
 * wildcard of its family (::ffff:0.0.0.0 for IPv4, :: for IPv6; user space registers a
 * dual-stack [::] under both). */
static __always_inline struct smc_listener_val *find_listener(struct bpf_sock_ops *skops)
{
	struct smc_listener_key k = {};
	struct smc_listener_val *v;
	__u32 *w = (__u32 *)k.addr;

	k.netns_cookie = bpf_get_netns_cookie(skops);
	k.port = skops->local_port;
	local_addr(skops, k.addr);
	v = bpf_map_lookup_elem(&smc_listeners, &k);
	if (v)
		return v;
	if (is_v4_mapped(k.addr)) {
		w[3] = 0;
	} else {
		w[0] = 0;
		w[1] = 0;
		w[2] = 0;
		w[3] = 0;
	}
	return bpf_map_lookup_elem(&smc_listeners, &k);
}

static __always_inline __u32 be32(const __u8 *b)
{
	return ((__u32)b[0] << 24) | ((__u32)b[1] << 16) | ((__u32)b[2] << 8) | b[3];
}

/* The key of the request a SYN-ACK answers (skops->sk is the request socket; its SYN is
 * reachable through TCP_BPF_SYN). */
static __always_inline int req_key_from_syn(struct bpf_sock_ops *skops, struct smc_req_key *k)
{
	struct tcp_base_hdr th[3] = {}; /* 60 bytes: the largest TCP header */

	if (bpf_getsockopt(skops, SOL_TCP, TCP_BPF_SYN, th, sizeof(th)) < 0)
		return -1;
	k->netns_cookie = bpf_get_netns_cookie(skops);
	local_addr(skops, k->laddr);
	remote_addr(skops, k->raddr);
	k->lport = skops->local_port;
	k->rport = skops->remote_port;
	k->isn = be32(th[0].seq);
	return 0;
}

/* The SYN-ACK's decision, taken once per request: echo when the SYN had the option, the
 * listener is registered and not congested, the SYN is no Fast Open, and the decision could be
 * recorded (an unrecorded echo would leave the accepted side thinking it had not echoed). */
static __always_inline int synack_echoes(struct bpf_sock_ops *skops, int decide)
{
	struct smc_req_key k = {};
	struct smc_listener_val *l;
	__u32 *rec, v;

	/* With syncookies the kernel clears smc_ok (tcp_conn_request: want_cookie). */
	if (skops->args[0] == BPF_WRITE_HDR_TCP_SYNACK_COOKIE)
		return 0;
	if (!has_smc_opt(skops, BPF_LOAD_HDR_OPT_TCP_SYN))
		return 0;
	if (req_key_from_syn(skops, &k) < 0)
		return 0;
	rec = bpf_map_lookup_elem(&smc_reqs, &k);
	if (rec)
		return (*rec & SMC_SK_ECHOED) != 0;
	if (!decide)
		return 0;
	l = find_listener(skops);
	if (!l)
		return 0; /* no SMC listener: nothing to remember */
	v = SMC_SK_PEER_OPT;
	if (!(l->flags & SMC_LISTENER_CONGESTED) && !has_tfo(skops))
		v |= SMC_SK_ECHOED;
	if (bpf_map_update_elem(&smc_reqs, &k, &v, BPF_NOEXIST) != 0)
		return 0;
	return (v & SMC_SK_ECHOED) != 0;
}

static __always_inline struct smc_sk_state *sk_state(struct bpf_sock_ops *skops, int create)
{
	struct bpf_sock *sk = skops->sk;

	if (!sk)
		return 0;
	return bpf_sk_storage_get(&smc_sk, sk, 0, create ? BPF_SK_STORAGE_GET_F_CREATE : 0);
}

static __always_inline void stop_hdr_cb(struct bpf_sock_ops *skops)
{
	if (skops->bpf_sock_ops_cb_flags & BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG)
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags &
					  ~BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
}

static __always_inline void hdr_opt_len(struct bpf_sock_ops *skops)
{
	__u32 fl = skops->skb_tcp_flags;
	struct smc_sk_state *st;

	if (!(fl & TCPHDR_SYN))
		return; /* only SYN and SYN-ACK carry the option */
	if (fl & TCPHDR_ACK) {
		if (synack_echoes(skops, 1))
			bpf_reserve_hdr_opt(skops, SMC_OPT_LEN, 0);
		return;
	}
	st = sk_state(skops, 0);
	if (st && (st->flags & SMC_SK_CLIENT))
		bpf_reserve_hdr_opt(skops, SMC_OPT_LEN, 0);
}

static __always_inline void write_hdr_opt(struct bpf_sock_ops *skops)
{
	__u32 fl = skops->skb_tcp_flags;
	struct smc_sk_state *st = 0;
	struct smc_opt o;

	if (!(fl & TCPHDR_SYN))
		return;
	if (fl & TCPHDR_ACK) {
		if (!synack_echoes(skops, 0))
			return;
	} else {
		st = sk_state(skops, 0);
		if (!st || !(st->flags & SMC_SK_CLIENT))
			return;
	}
	smc_opt_init(&o);
	/* -EEXIST (another program wrote it) is as good as writing it. */
	if (bpf_store_hdr_opt(skops, &o, sizeof(o), 0) == 0 && st)
		st->flags |= SMC_SK_SYN_OPT_SENT;
}

static __always_inline void active_established(struct bpf_sock_ops *skops)
{
	struct smc_sk_state *st = sk_state(skops, 0);

	stop_hdr_cb(skops);
	if (!st || !(st->flags & SMC_SK_CLIENT))
		return;
	/* skb is the SYN-ACK that ends the handshake. */
	if ((st->flags & SMC_SK_SYN_OPT_SENT) && has_smc_opt(skops, 0))
		st->flags |= SMC_SK_PEER_OPT;
	st->flags |= SMC_SK_ESTABLISHED;
}

static __always_inline void passive_established(struct bpf_sock_ops *skops)
{
	struct smc_req_key k = {};
	struct smc_sk_state *st;
	__u32 *rec, v = 0;

	/* The child inherited the listener's callback flags: no callback per segment. */
	stop_hdr_cb(skops);
	if (!find_listener(skops))
		return;
	/* The child's rcv_nxt is the client's ISN + 1 here (tcp_create_openreq_child; the
	 * segment that made the child is queued after this callback). Not the segment's own
	 * sequence number: when the accept queue was full the ACK that ended the handshake was
	 * dropped, and the segment that makes the child may be a later one, after the client's
	 * Proposal (its sequence number then is the ISN + 1 + the Proposal's length). */
	k.netns_cookie = bpf_get_netns_cookie(skops);
	local_addr(skops, k.laddr);
	remote_addr(skops, k.raddr);
	k.lport = skops->local_port;
	k.rport = skops->remote_port;
	k.isn = skops->rcv_nxt - 1;
	rec = bpf_map_lookup_elem(&smc_reqs, &k);
	if (rec) {
		v = *rec & (SMC_SK_PEER_OPT | SMC_SK_ECHOED);
		bpf_map_delete_elem(&smc_reqs, &k);
	}
	st = sk_state(skops, 1);
	if (st)
		st->flags = v | SMC_SK_PASSIVE | SMC_SK_ESTABLISHED;
}

SEC("sockops")
int smc_option(struct bpf_sock_ops *skops)
{
	struct smc_sk_state *st;

	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_CONNECT_CB:
		st = sk_state(skops, 0);
		if (st && (st->flags & SMC_SK_CLIENT))
			bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
						  BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		break;
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		/* Any listener may be (or become) a registered SMC listener; its SYN-ACKs are
		 * decided per request. */
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
					  BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG);
		break;
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		hdr_opt_len(skops);
		break;
	case BPF_SOCK_OPS_WRITE_HDR_OPT_CB:
		write_hdr_opt(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		active_established(skops);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		passive_established(skops);
		break;
	}
	/* 1: a program that returns 0 makes the kernel drop what it reserved. */
	return 1;
}

char _license[] SEC("license") = "Dual MIT/GPL";
