// verbs::Fabric on libibverbs + librdmacm: one rdma_cm id, protection domain, completion
// queue (with a completion channel for blocking waits) and RC queue pair per endpoint.
// Built whenever libibverbs-dev and librdmacm-dev are present; at run time it needs an
// RDMA device (make_ibverbs_fabric() says clearly when there is none).
#include "ember/common/error.h"
#include "ember/transport/rdma.h"
#include "ember/transport/verbs.h"

#ifdef EMBER_HAVE_RDMA
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#endif

namespace ember::transport::verbs {

#ifdef EMBER_HAVE_RDMA
namespace {

using std::chrono::milliseconds;

std::string sys(const std::string& what) { return what + ": " + std::strerror(errno); }

// Waits for the next event on `ch` within `timeout`; nullptr on timeout.
rdma_cm_event* next_event(rdma_event_channel* ch, milliseconds timeout) {
  pollfd p{ch->fd, POLLIN, 0};
  int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (r < 0) throw IoError(sys("rdma_cm: poll"));
  if (r == 0) return nullptr;
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) throw IoError(sys("rdma_get_cm_event"));
  return ev;
}

// Waits for `want`; any other event (or a timeout) is an error naming what came instead.
void expect_event(rdma_event_channel* ch, rdma_cm_event_type want, milliseconds timeout, const std::string& peer) {
  rdma_cm_event* ev = next_event(ch, timeout);
  if (ev == nullptr) throw IoError("RDMA " + peer + ": " + rdma_event_str(want) + " timed out");
  rdma_cm_event_type got = ev->event;
  int status = ev->status;
  rdma_ack_cm_event(ev);
  if (got != want) {
    throw IoError("RDMA " + peer + ": expected " + rdma_event_str(want) + ", got " + rdma_event_str(got) + " (status " +
                  std::to_string(status) + ")");
  }
}

class IbvEndpoint final : public Endpoint {
 public:
  // Takes `id` (already bound to a device) and creates the PD, CQ and QP on it.
  IbvEndpoint(rdma_cm_id* id, rdma_event_channel* channel, std::string peer) : id_(id), channel_(channel), peer_(std::move(peer)) {
    pd_ = ibv_alloc_pd(id_->verbs);
    if (pd_ == nullptr) throw IoError(sys("ibv_alloc_pd"));
    comp_ = ibv_create_comp_channel(id_->verbs);
    if (comp_ == nullptr) throw IoError(sys("ibv_create_comp_channel"));
    cq_ = ibv_create_cq(id_->verbs, 8192, nullptr, comp_, 0);
    if (cq_ == nullptr) throw IoError(sys("ibv_create_cq"));
    ibv_qp_init_attr qa{};
    qa.send_cq = cq_;
    qa.recv_cq = cq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 4096;
    qa.cap.max_recv_wr = 4096;
    // Sends gather their pieces in place (a reply's rows from the store): as many per work
    // request as the device takes, up to kMaxSendSges.
    ibv_device_attr attr{};
    if (ibv_query_device(id_->verbs, &attr) != 0) throw IoError(sys("ibv_query_device"));
    qa.cap.max_send_sge = static_cast<std::uint32_t>(std::clamp(attr.max_sge, 1, static_cast<int>(kMaxSendSges)));
    qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(id_, pd_, &qa) != 0) throw IoError(sys("rdma_create_qp"));
    max_send_sges_ = std::clamp<std::uint32_t>(qa.cap.max_send_sge, 1, kMaxSendSges);  // what the queue pair got
    arm();
  }

  ~IbvEndpoint() override {
    if (connected_) rdma_disconnect(id_);
    if (id_->qp != nullptr) rdma_destroy_qp(id_);
    for (ibv_mr* mr : mrs_) ibv_dereg_mr(mr);
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    if (comp_ != nullptr) ibv_destroy_comp_channel(comp_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    rdma_destroy_id(id_);
    if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  }

  MemoryRegion register_memory(void* addr, std::size_t bytes) override {
    return add_region(addr, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, "");
  }

  MemoryRegion register_for_sends(const void* addr, std::size_t bytes) override {
    // No access flags: local reads only (what a send's gather needs).
    return add_region(const_cast<void*>(addr), bytes, 0, " for sends");
  }

  std::uint32_t max_send_sges() const override { return max_send_sges_; }

  void post_recv(const RecvRequest& r) override {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(r.sge.addr), r.sge.length, r.sge.lkey};
    ibv_recv_wr wr{};
    wr.wr_id = r.wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (int e = ibv_post_recv(id_->qp, &wr, &bad); e != 0) throw IoError("ibv_post_recv: " + std::string(std::strerror(e)));
  }

  void post_send(const SendRequest& s) override {
    if (s.sge_count == 0 || s.sge_count > max_send_sges_) throw IoError("ibv_post_send: gather list of " + std::to_string(s.sge_count));
    ibv_sge sges[kMaxSendSges];
    for (std::uint32_t i = 0; i < s.sge_count; ++i) {
      sges[i] = {reinterpret_cast<std::uintptr_t>(s.sges[i].addr), s.sges[i].length, s.sges[i].lkey};
    }
    ibv_send_wr wr{};
    wr.wr_id = s.wr_id;
    wr.sg_list = sges;
    wr.num_sge = static_cast<int>(s.sge_count);
    wr.send_flags = IBV_SEND_SIGNALED;
    if (s.opcode == Opcode::kSend) {
      wr.opcode = IBV_WR_SEND;
    } else {
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.imm_data = htonl(s.imm);
      wr.wr.rdma.remote_addr = s.remote_addr;
      wr.wr.rdma.rkey = s.rkey;
    }
    ibv_send_wr* bad = nullptr;
    if (int e = ibv_post_send(id_->qp, &wr, &bad); e != 0) throw IoError("ibv_post_send: " + std::string(std::strerror(e)));
  }

  std::size_t poll(std::span<Completion> out) override {
    ibv_wc wc[32];
    int n = ibv_poll_cq(cq_, static_cast<int>(std::min<std::size_t>(out.size(), 32)), wc);
    if (n < 0) throw IoError("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      Completion& c = out[static_cast<std::size_t>(i)];
      c = Completion{};
      c.wr_id = wc[i].wr_id;
      c.ok = wc[i].status == IBV_WC_SUCCESS;
      c.flushed = wc[i].status == IBV_WC_WR_FLUSH_ERR;
      if (!c.ok) c.status = ibv_wc_status_str(wc[i].status);
      c.byte_len = wc[i].byte_len;
      switch (wc[i].opcode) {
        case IBV_WC_RECV:
          c.opcode = Opcode::kRecv;
          break;
        case IBV_WC_RECV_RDMA_WITH_IMM:
          c.opcode = Opcode::kRecvWithImm;
          c.imm = ntohl(wc[i].imm_data);
          break;
        case IBV_WC_RDMA_WRITE:
          c.opcode = Opcode::kWriteWithImm;
          break;
        default:
          c.opcode = Opcode::kSend;
      }
      // Error completions do not carry a valid opcode: tell RECVs apart by wr_id (the
      // protocol tags its sends), which the caller does.
    }
    return static_cast<std::size_t>(n);
  }

  void wait(milliseconds timeout) override {
    pollfd fds[2] = {{comp_->fd, POLLIN, 0}, {channel_ ? channel_->fd : -1, POLLIN, 0}};
    int r = ::poll(fds, channel_ ? 2 : 1, static_cast<int>(timeout.count()));
    if (r <= 0) return;
    if (fds[0].revents & POLLIN) {
      ibv_cq* cq = nullptr;
      void* ctx = nullptr;
      if (ibv_get_cq_event(comp_, &cq, &ctx) == 0) {
        ibv_ack_cq_events(cq, 1);
        arm();
      }
    }
    if (channel_ && (fds[1].revents & POLLIN)) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(channel_, &ev) == 0) {
        // The peer left: moving the QP to the error state flushes the posted RECVs, which
        // is how the protocol learns about it.
        bool gone = ev->event == RDMA_CM_EVENT_DISCONNECTED;
        rdma_ack_cm_event(ev);
        if (gone && connected_) {
          rdma_disconnect(id_);
          connected_ = false;
        }
      }
    }
  }

  std::vector<std::uint8_t> connect(std::span<const std::uint8_t> private_data, milliseconds timeout) override {
    rdma_conn_param p{};
    p.private_data = private_data.data();
    p.private_data_len = static_cast<std::uint8_t>(private_data.size());
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    if (rdma_connect(id_, &p) != 0) throw IoError(sys("rdma_connect to " + peer_));
    rdma_cm_event* ev = next_event(channel_, timeout);
    if (ev == nullptr) throw IoError("RDMA connect to " + peer_ + ": timed out after " + std::to_string(timeout.count()) + " ms");
    std::vector<std::uint8_t> reply;
    const rdma_cm_event_type type = ev->event;
    if (ev->param.conn.private_data != nullptr) {
      auto* b = static_cast<const std::uint8_t*>(ev->param.conn.private_data);
      reply.assign(b, b + ev->param.conn.private_data_len);
    }
    rdma_ack_cm_event(ev);
    if (type == RDMA_CM_EVENT_REJECTED) {
      std::string why(reply.begin(), std::find(reply.begin(), reply.end(), std::uint8_t{0}));
      throw IoError("RDMA connect to " + peer_ + " refused: " + (why.empty() ? std::string("rejected") : why));
    }
    if (type != RDMA_CM_EVENT_ESTABLISHED) throw IoError("RDMA connect to " + peer_ + ": " + rdma_event_str(type));
    connected_ = true;
    return reply;
  }

  void accept(std::span<const std::uint8_t> private_data) override {
    rdma_conn_param p{};
    p.private_data = private_data.data();
    p.private_data_len = static_cast<std::uint8_t>(private_data.size());
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.rnr_retry_count = 7;
    if (rdma_accept(id_, &p) != 0) throw IoError(sys("rdma_accept from " + peer_));
    connected_ = true;
  }

  void reject(const std::string& why) override {
    std::string w = why.substr(0, 55);
    rdma_reject(id_, w.c_str(), static_cast<std::uint8_t>(w.size() + 1));
  }

  const std::string& peer() const override { return peer_; }

 private:
  void arm() {
    if (ibv_req_notify_cq(cq_, 0) != 0) throw IoError("ibv_req_notify_cq failed");
  }

  // Registers memory with `access`, deregistered with the endpoint.
  MemoryRegion add_region(void* addr, std::size_t bytes, int access, const char* what) {
    ibv_mr* mr = ibv_reg_mr(pd_, addr, bytes, access);
    if (mr == nullptr) throw IoError(sys("ibv_reg_mr of " + std::to_string(bytes) + " bytes" + what));
    mrs_.push_back(mr);
    return {static_cast<std::uint8_t*>(addr), bytes, mr->lkey, mr->rkey};
  }

  rdma_cm_id* id_;
  rdma_event_channel* channel_;  // owned: this endpoint's connection events
  std::string peer_;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_mr*> mrs_;
  std::uint32_t max_send_sges_ = 1;
  bool connected_ = false;
};

class IbvListener final : public Listener {
 public:
  IbvListener(const std::string& address, std::uint16_t port) {
    channel_ = rdma_create_event_channel();
    if (channel_ == nullptr) throw IoError(sys("rdma_create_event_channel"));
    if (rdma_create_id(channel_, &id_, nullptr, RDMA_PS_TCP) != 0) throw IoError(sys("rdma_create_id"));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) throw ConfigError("RDMA listen address '" + address + "' is not IPv4");
    if (rdma_bind_addr(id_, reinterpret_cast<sockaddr*>(&a)) != 0)
      throw IoError(sys("rdma_bind_addr " + address + ":" + std::to_string(port)));
    if (rdma_listen(id_, 64) != 0) throw IoError(sys("rdma_listen"));
  }
  ~IbvListener() override {
    if (id_ != nullptr) rdma_destroy_id(id_);
    if (channel_ != nullptr) rdma_destroy_event_channel(channel_);
  }
  std::uint16_t port() const override { return ntohs(rdma_get_src_port(id_)); }

  std::optional<ConnectRequest> next(milliseconds timeout) override {
    rdma_cm_event* ev = next_event(channel_, timeout);
    if (ev == nullptr) return std::nullopt;
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(ev);  // ESTABLISHED and the like for ids not yet migrated
      return std::nullopt;
    }
    rdma_cm_id* cid = ev->id;
    ConnectRequest r;
    if (ev->param.conn.private_data != nullptr) {
      auto* b = static_cast<const std::uint8_t*>(ev->param.conn.private_data);
      r.private_data.assign(b, b + ev->param.conn.private_data_len);
    }
    rdma_ack_cm_event(ev);
    char host[INET6_ADDRSTRLEN] = "?";
    sockaddr* peer = rdma_get_peer_addr(cid);
    if (peer != nullptr && peer->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(peer)->sin_addr, host, sizeof(host));
    }
    std::string name = std::string(host) + ":" + std::to_string(ntohs(rdma_get_dst_port(cid)));
    // The connection's own events (disconnect) go to its own channel.
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr || rdma_migrate_id(cid, ch) != 0) {
      if (ch != nullptr) rdma_destroy_event_channel(ch);
      rdma_reject(cid, nullptr, 0);
      rdma_destroy_id(cid);
      throw IoError(sys("rdma_migrate_id"));
    }
    r.endpoint = std::make_unique<IbvEndpoint>(cid, ch, name);
    return r;
  }

 private:
  rdma_event_channel* channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
};

class IbvFabric final : public Fabric {
 public:
  std::unique_ptr<Listener> listen(const std::string& address, std::uint16_t port) override {
    return std::make_unique<IbvListener>(address, port);
  }

  std::unique_ptr<Endpoint> resolve(const std::string& host, std::uint16_t port, milliseconds timeout) override {
    const std::string peer = host + ":" + std::to_string(port);
    rdma_event_channel* ch = rdma_create_event_channel();
    if (ch == nullptr) throw IoError(sys("rdma_create_event_channel"));
    rdma_cm_id* id = nullptr;
    if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) {
      rdma_destroy_event_channel(ch);
      throw IoError(sys("rdma_create_id"));
    }
    try {
      addrinfo hints{};
      hints.ai_family = AF_INET;
      addrinfo* res = nullptr;
      if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || res == nullptr) {
        throw IoError("RDMA " + peer + ": cannot resolve the host");
      }
      int rc = rdma_resolve_addr(id, nullptr, res->ai_addr, static_cast<int>(timeout.count()));
      freeaddrinfo(res);
      if (rc != 0) throw IoError(sys("rdma_resolve_addr " + peer));
      expect_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED, timeout, peer);
      if (rdma_resolve_route(id, static_cast<int>(timeout.count())) != 0) throw IoError(sys("rdma_resolve_route " + peer));
      expect_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, timeout, peer);
      return std::make_unique<IbvEndpoint>(id, ch, peer);
    } catch (...) {
      rdma_destroy_id(id);
      rdma_destroy_event_channel(ch);
      throw;
    }
  }
};

}  // namespace

std::unique_ptr<Fabric> make_ibverbs_fabric() {
  std::string why = rdma_unavailable_reason();
  if (!why.empty()) throw ConfigError(why);
  return std::make_unique<IbvFabric>();
}

#else

std::unique_ptr<Fabric> make_ibverbs_fabric() { throw ConfigError(rdma_unavailable_reason()); }

#endif

}  // namespace ember::transport::verbs
