// Stores: tutti.Store and its kinds (HashStore, FileStore, TCPStore, RedisStore, PrefixStore),
// TCPStoreServer and open_store. Values are bytes (str is accepted and sent as UTF-8). Every
// blocking call runs without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "tutti/file_store.h"
#include "tutti/hash_store.h"
#include "tutti/prefix_store.h"
#include "tutti/redis_store.h"
#include "tutti/store.h"
#include "tutti/tcp_store.h"

namespace tutti::python {
namespace {

using namespace nb::literals;

std::chrono::milliseconds store_timeout(nb::handle timeout, const char* where) {
  if (timeout.is_none()) return Store::kDefaultTimeout;
  return to_milliseconds(timeout, where, "timeout");
}

std::vector<std::string> to_keys(nb::handle keys, const char* where) {
  std::vector<std::string> out;
  if (PyUnicode_Check(keys.ptr()) || PyBytes_Check(keys.ptr())) {
    out.push_back(to_bytes(keys, where));
    return out;
  }
  for (nb::handle k : keys) out.push_back(to_bytes(k, where));
  return out;
}

nb::bytes as_bytes(const std::string& s) {
  return nb::bytes(s.data(), s.size());
}

}  // namespace

void bind_stores(nb::module_& m) {
  nb::class_<Store>(m, "Store",
                    "The key-value rendezvous store (set/get/add/compare_set/wait/check/"
                    "delete_key/num_keys). Thread-safe; blocking calls release the GIL and end "
                    "with tutti.TimeoutError at their deadline.")
      .def(
          "set",
          [](Store& s, nb::handle key, nb::handle value) {
            std::string k = to_bytes(key, "Store.set"), v = to_bytes(value, "Store.set");
            nb::gil_scoped_release release;
            s.set(k, v);
          },
          "key"_a, "value"_a)
      .def(
          "get",
          [](Store& s, nb::handle key) {
            std::string k = to_bytes(key, "Store.get"), v;
            {
              nb::gil_scoped_release release;
              v = s.get(k);
            }
            return as_bytes(v);
          },
          "key"_a, "Waits up to the store's timeout for the key, then returns its value.")
      .def(
          "add",
          [](Store& s, nb::handle key, int64_t delta) {
            std::string k = to_bytes(key, "Store.add");
            nb::gil_scoped_release release;
            return s.add(k, delta);
          },
          "key"_a, "delta"_a = 1)
      .def(
          "compare_set",
          [](Store& s, nb::handle key, nb::handle expected, nb::handle desired) {
            std::string k = to_bytes(key, "Store.compare_set");
            std::string e = to_bytes(expected, "Store.compare_set");
            std::string d = to_bytes(desired, "Store.compare_set"), v;
            {
              nb::gil_scoped_release release;
              v = s.compare_set(k, e, d);
            }
            return as_bytes(v);
          },
          "key"_a, "expected"_a, "desired"_a)
      .def(
          "wait",
          [](Store& s, nb::handle keys, nb::handle timeout) {
            auto k = to_keys(keys, "Store.wait");
            const auto t =
                timeout.is_none() ? s.timeout() : to_milliseconds(timeout, "Store.wait", "timeout");
            nb::gil_scoped_release release;
            s.wait(k, t);
          },
          "keys"_a, "timeout"_a = nb::none())
      .def(
          "check",
          [](Store& s, nb::handle keys) {
            auto k = to_keys(keys, "Store.check");
            nb::gil_scoped_release release;
            return s.check(k);
          },
          "keys"_a)
      .def(
          "delete_key",
          [](Store& s, nb::handle key) {
            std::string k = to_bytes(key, "Store.delete_key");
            nb::gil_scoped_release release;
            return s.delete_key(k);
          },
          "key"_a)
      .def("num_keys", &Store::num_keys, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_rw(
          "timeout", [](const Store& s) { return s.timeout().count() / 1000.0; },
          [](Store& s, nb::handle t) { s.set_timeout(to_milliseconds(t, "Store", "timeout")); });

  nb::class_<HashStore, Store>(m, "HashStore", "An in-memory store for ranks that are threads.")
      .def(
          "__init__",
          [](HashStore* self, nb::handle timeout) {
            new (self) HashStore(store_timeout(timeout, "HashStore"));
          },
          "timeout"_a = nb::none());

  nb::class_<FileStore, Store>(m, "FileStore",
                               "A store in one file, for processes on one host or a shared "
                               "file system (use a fresh path per job).")
      .def(
          "__init__",
          [](FileStore* self, const std::string& path, nb::handle timeout) {
            const auto t = store_timeout(timeout, "FileStore");
            nb::gil_scoped_release release;
            new (self) FileStore(path, t);
          },
          "path"_a, "timeout"_a = nb::none())
      .def_prop_ro("path", &FileStore::path);

  nb::class_<TCPStore, Store>(m, "TCPStore",
                              "A client of a TCP store server; host_server=True also serves "
                              "the address from this process (port 0 picks a free port).")
      .def(
          "__init__",
          [](TCPStore* self, const std::string& host, uint16_t port, bool host_server,
             nb::handle timeout, const std::string& secret) {
            TCPStoreOptions o;
            o.timeout = store_timeout(timeout, "TCPStore");
            o.host = host_server;
            o.secret = secret;
            nb::gil_scoped_release release;
            new (self) TCPStore(host, port, o);
          },
          "host"_a, "port"_a, "host_server"_a = false, nb::kw_only(), "timeout"_a = nb::none(),
          "secret"_a = "")
      .def_prop_ro("host", &TCPStore::host)
      .def_prop_ro("port", &TCPStore::port)
      .def_prop_ro("is_hosting", &TCPStore::is_hosting)
      .def(
          "set_on_close",
          [](TCPStore& s, nb::handle key, nb::handle value) {
            std::string k = to_bytes(key, "TCPStore.set_on_close");
            std::string v = to_bytes(value, "TCPStore.set_on_close");
            nb::gil_scoped_release release;
            s.set_on_close(k, v);
          },
          "key"_a, "value"_a,
          "The server sets key to value when this client's connection ends (it exits or dies).");

  nb::class_<PrefixStore, Store>(m, "PrefixStore", "A namespace inside another store.")
      .def(nb::init<std::string, std::shared_ptr<Store>>(), "prefix"_a, "store"_a)
      .def_prop_ro("prefix", &PrefixStore::prefix)
      .def_prop_ro("underlying", &PrefixStore::underlying);

  nb::class_<RedisStore, Store>(m, "RedisStore", "The store over a Redis server.")
      .def(
          "__init__",
          [](RedisStore* self, const std::string& host, uint16_t port, nb::handle timeout, int db,
             const std::string& prefix, const std::string& password) {
            RedisStoreOptions o;
            o.timeout = store_timeout(timeout, "RedisStore");
            o.db = db;
            o.prefix = prefix;
            o.password = password;
            nb::gil_scoped_release release;
            new (self) RedisStore(host, port, o);
          },
          "host"_a, "port"_a, nb::kw_only(), "timeout"_a = nb::none(), "db"_a = 0,
          "prefix"_a = "tutti/", "password"_a = "");

  nb::class_<TCPStoreServer>(m, "TCPStoreServer",
                             "A TCP store server on a background thread (port 0: a free port).")
      .def(
          "__init__",
          [](TCPStoreServer* self, const std::string& host, uint16_t port,
             const std::string& secret) {
            nb::gil_scoped_release release;
            new (self) TCPStoreServer(host, port, secret);
          },
          "host"_a = "127.0.0.1", "port"_a = 0, "secret"_a = "")
      .def_prop_ro("port", &TCPStoreServer::port)
      .def_prop_ro("host", &TCPStoreServer::host)
      .def_prop_ro("nonce", &TCPStoreServer::nonce)
      .def("url", [](const TCPStoreServer& s) {
        return "tcp://" + s.host() + ":" + std::to_string(s.port());
      });

  m.def(
      "open_store",
      [](const std::string& url, nb::handle timeout, bool host) {
        const auto t = store_timeout(timeout, "open_store");
        nb::gil_scoped_release release;
        return open_store(url, t, host);
      },
      "url"_a, "timeout"_a = nb::none(), "host"_a = false,
      "A store from a URL: tcp://host:port[?secret=], redis://host:port[/db][?prefix=], "
      "file:///path, hash://. host=True: this process also serves a tcp:// address.");
}

}  // namespace tutti::python
