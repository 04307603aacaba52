/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The few BPF definitions smc_option.bpf.c needs, so that it builds with nothing but clang
 * (no libbpf headers, no kernel headers: the object must come out byte for byte the same on
 * every machine, whatever linux-libc-dev it has). Every number here is the kernel's UAPI
 * (include/uapi/linux/bpf.h, tcp.h, in.h); the struct is a prefix of struct bpf_sock_ops,
 * which the verifier rewrites by offset, so a prefix is enough.
 */
#ifndef SMC_BPF_H
#define SMC_BPF_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef int __s32;
typedef long long __s64;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))

/* BTF-defined maps (the .maps section), as libbpf and aya read them. */
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name

/* enum bpf_map_type */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_SK_STORAGE 24
/* map_flags */
#define BPF_F_NO_PREALLOC (1U << 0)
/* update flags */
#define BPF_ANY 0
#define BPF_NOEXIST 1
/* bpf_sk_storage_get flags */
#define BPF_SK_STORAGE_GET_F_CREATE (1ULL << 0)

/* sock_ops operations (skops->op) */
#define BPF_SOCK_OPS_TCP_CONNECT_CB 3
#define BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB 4
#define BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB 5
#define BPF_SOCK_OPS_TCP_LISTEN_CB 11
#define BPF_SOCK_OPS_HDR_OPT_LEN_CB 14
#define BPF_SOCK_OPS_WRITE_HDR_OPT_CB 15
/* bpf_sock_ops_cb_flags */
#define BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG (1 << 6)
/* bpf_load_hdr_opt flags */
#define BPF_LOAD_HDR_OPT_TCP_SYN (1ULL << 0)
/* args[0] of HDR_OPT_LEN_CB / WRITE_HDR_OPT_CB */
#define BPF_WRITE_HDR_TCP_CURRENT_MSS 1
#define BPF_WRITE_HDR_TCP_SYNACK_COOKIE 2

/* socket families, TCP header flags, options */
#define AF_INET 2
#define AF_INET6 10
#define SOL_TCP 6
#define TCP_BPF_SYN 1005 /* bpf_getsockopt: the SYN's TCP header, options included */
#define TCPHDR_SYN 0x02
#define TCPHDR_ACK 0x10
#define TCPOPT_EXP 254
#define TCPOPT_FASTOPEN 34

struct bpf_sock;

/* struct bpf_sock_ops up to skb_tcp_flags (UAPI offsets: sk 184, skb_data 192). */
struct bpf_sock_ops {
	__u32 op;
	union {
		__u32 args[4];
		__u32 reply;
		__u32 replylong[4];
	};
	__u32 family;
	__u32 remote_ip4;     /* network byte order */
	__u32 local_ip4;      /* network byte order */
	__u32 remote_ip6[4];  /* network byte order */
	__u32 local_ip6[4];   /* network byte order */
	__u32 remote_port;    /* network byte order, in the upper 16 bits on little endian */
	__u32 local_port;     /* host byte order */
	__u32 is_fullsock;
	__u32 snd_cwnd;
	__u32 srtt_us;
	__u32 bpf_sock_ops_cb_flags;
	__u32 state;
	__u32 rtt_min;
	__u32 snd_ssthresh;
	__u32 rcv_nxt;
	__u32 snd_nxt;
	__u32 snd_una;
	__u32 mss_cache;
	__u32 ecn_flags;
	__u32 rate_delivered;
	__u32 rate_interval_us;
	__u32 packets_out;
	__u32 retrans_out;
	__u32 total_retrans;
	__u32 segs_in;
	__u32 data_segs_in;
	__u32 segs_out;
	__u32 data_segs_out;
	__u32 lost_out;
	__u32 sacked_out;
	__u32 sk_txhash;
	__u64 bytes_received;
	__u64 bytes_acked;
	union { struct bpf_sock *sk; __u64 :64; } __attribute__((aligned(8)));
	union { void *skb_data; __u64 :64; } __attribute__((aligned(8)));
	union { void *skb_data_end; __u64 :64; } __attribute__((aligned(8)));
	__u32 skb_len;
	__u32 skb_tcp_flags;
};

/* The first 20 bytes of a TCP header, as bytes (no bitfields, no byte order games). */
struct tcp_base_hdr {
	__u8 source[2];
	__u8 dest[2];
	__u8 seq[4];
	__u8 ack_seq[4];
	__u8 doff_res;
	__u8 flags;
	__u8 window[2];
	__u8 check[2];
	__u8 urg_ptr[2];
};

/* Helpers, by their numbers in __BPF_FUNC_MAPPER. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_map_update_elem)(void *map, const void *key, const void *value,
				   __u64 flags) = (void *)2;
static long (*bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static long (*bpf_getsockopt)(void *ctx, int level, int optname, void *optval,
			      int optlen) = (void *)57;
static long (*bpf_sock_ops_cb_flags_set)(struct bpf_sock_ops *skops, int flags) = (void *)59;
static void *(*bpf_sk_storage_get)(void *map, void *sk, void *value, __u64 flags) = (void *)107;
static __u64 (*bpf_get_netns_cookie)(void *ctx) = (void *)122;
static long (*bpf_load_hdr_opt)(struct bpf_sock_ops *skops, void *searchby_res, __u32 len,
				__u64 flags) = (void *)142;
static long (*bpf_store_hdr_opt)(struct bpf_sock_ops *skops, const void *from, __u32 len,
				 __u64 flags) = (void *)143;
static long (*bpf_reserve_hdr_opt)(struct bpf_sock_ops *skops, __u32 len,
				   __u64 flags) = (void *)144;

#endif
