// A TCP store connection's byte stream (internal): the socket itself, or TLS over it when the
// store asks for TLS (util/tls.h). Both sides of the store use it through asio's composed
// operations (async_read, async_write), which need only async_read_some/async_write_some.
#pragma once

#include <asio.hpp>
#include <asio/ssl.hpp>
#include <memory>
#include <optional>
#include <utility>

namespace tutti::detail {

class StoreStream {
 public:
  using executor_type = asio::ip::tcp::socket::executor_type;

  // `tls` null: plain TCP.
  StoreStream(asio::io_context& io, asio::ssl::context* tls) {
    if (tls != nullptr) {
      tls_.emplace(io, *tls);
    } else {
      plain_.emplace(io);
    }
  }
  StoreStream(asio::ip::tcp::socket socket, asio::ssl::context* tls) {
    if (tls != nullptr) {
      tls_.emplace(std::move(socket), *tls);
    } else {
      plain_.emplace(std::move(socket));
    }
  }

  asio::ip::tcp::socket& socket() { return tls_ ? tls_->next_layer() : *plain_; }
  executor_type get_executor() { return socket().get_executor(); }
  bool tls() const { return tls_.has_value(); }
  SSL* tls_handle() { return tls_ ? tls_->native_handle() : nullptr; }

  template <typename Buffers, typename Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_read_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_read_some(buffers, std::forward<Handler>(handler));
    }
  }
  template <typename Buffers, typename Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_) {
      tls_->async_write_some(buffers, std::forward<Handler>(handler));
    } else {
      plain_->async_write_some(buffers, std::forward<Handler>(handler));
    }
  }
  // The TLS handshake; with plain TCP, the handler runs at once (posted) with no error.
  template <typename Handler>
  void async_handshake(bool server, Handler&& handler) {
    if (tls_) {
      tls_->async_handshake(
          server ? asio::ssl::stream_base::server : asio::ssl::stream_base::client,
          std::forward<Handler>(handler));
    } else {
      asio::post(get_executor(),
                 [h = std::forward<Handler>(handler)]() mutable { h(asio::error_code()); });
    }
  }

 private:
  std::optional<asio::ip::tcp::socket> plain_;
  std::optional<asio::ssl::stream<asio::ip::tcp::socket>> tls_;
};

// An asio TLS context over a PSK context (util/tls.h), which it shares.
inline std::unique_ptr<asio::ssl::context> asio_context(const std::shared_ptr<SSL_CTX>& ctx) {
  SSL_CTX_up_ref(ctx.get());  // the asio context frees its reference
  return std::make_unique<asio::ssl::context>(ctx.get());
}

}  // namespace tutti::detail
