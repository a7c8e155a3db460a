#include "tutti/redis_store.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "store/store_util.h"
#include "tutti/error.h"
#include "util/deadline.h"

#if TUTTI_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

namespace tutti {

#if TUTTI_HAVE_HIREDIS

namespace {
using Clock = std::chrono::steady_clock;

// Sets `desired` when the value equals `expected` (or the key is missing and expected is
// empty) and returns the value afterwards, as Store::compare_set does; atomic on the server.
constexpr const char* kCompareSetScript = R"(
local v = redis.call('GET', KEYS[1])
if v == false then
  if ARGV[1] == '' then redis.call('SET', KEYS[1], ARGV[2]) return ARGV[2] end
  return ARGV[1]
end
if v == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return ARGV[2] end
return v
)";

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// A socket timeout for one command: a day at most (hiredis turns it into int milliseconds;
// commands are short, waits poll).
timeval to_timeval(std::chrono::milliseconds ms) {
  ms = std::clamp(ms, std::chrono::milliseconds(1), std::chrono::milliseconds(24 * 3600 * 1000));
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}
}  // namespace

struct RedisStore::Impl {
  std::string host;
  uint16_t port = 0;
  RedisStoreOptions options;
  std::mutex mutex;
  redisContext* ctx = nullptr;

  ~Impl() {
    if (ctx) redisFree(ctx);
  }

  std::string where() const { return "RedisStore " + host + ":" + std::to_string(port); }

  void connect(std::chrono::milliseconds timeout) {
    const auto deadline = detail::deadline_after(timeout);
    auto pause = std::chrono::milliseconds(10);
    std::string last = "no attempt";
    while (true) {
      ctx = redisConnectWithTimeout(host.c_str(), port,
                                    to_timeval(std::min(timeout, std::chrono::milliseconds(5000))));
      if (ctx && !ctx->err) break;
      last = ctx ? ctx->errstr : "cannot allocate a context";
      if (ctx) redisFree(ctx);
      ctx = nullptr;
      if (Clock::now() >= deadline) {
        throw Error(ErrorCode::kTimeout,
                    where() + ": could not connect before the timeout (" + last + ")");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(500));
    }
    redisSetTimeout(ctx, to_timeval(timeout));
    try {
      if (!options.password.empty()) command_locked({"AUTH", options.password}, "AUTH");
      if (options.db != 0) command_locked({"SELECT", std::to_string(options.db)}, "SELECT");
    } catch (const Error&) {
      // Not usable as it is: the next call connects (and authenticates) again.
      if (ctx) redisFree(ctx);
      ctx = nullptr;
      throw;
    }
  }

  // Redis's answers to a missing or wrong password (AUTH, or any command before it).
  static bool is_auth_error(const std::string& text) {
    for (const char* prefix : {"NOAUTH", "WRONGPASS", "ERR invalid password", "ERR AUTH"}) {
      if (text.rfind(prefix, 0) == 0) return true;
    }
    return false;
  }

  // Runs one command; a transport failure drops the connection (the next call reconnects) and
  // throws kIoError/kTimeout; a missing or wrong password throws kInvalidArgument; another Redis
  // error reply throws kInvalidUsage with Redis's words.
  Reply command_locked(const std::vector<std::string>& args, const std::string& what) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply reply(static_cast<redisReply*>(
        redisCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!reply) {
      const bool timed_out = ctx->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
      const std::string err = ctx->errstr;
      redisFree(ctx);
      ctx = nullptr;
      throw Error(timed_out ? ErrorCode::kTimeout : ErrorCode::kIoError,
                  where() + ": " + what + " failed: " + err);
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string text(reply->str, reply->len);
      if (is_auth_error(text)) {
        // As the TCP store's refused secret: the value given is wrong, and trying again with it
        // cannot help.
        throw Error(ErrorCode::kInvalidArgument, where() + ": " + what +
                                                     ": the server refused the password (" + text +
                                                     "); give the right one with ?password=");
      }
      throw Error(ErrorCode::kInvalidUsage, where() + ": " + what + ": " + text);
    }
    return reply;
  }

  Reply command(const std::vector<std::string>& args, const std::string& what,
                std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!ctx) connect(timeout);
    return command_locked(args, what);
  }

  std::string key(const std::string& k) const { return options.prefix + k; }
};

RedisStore::RedisStore(std::string host, uint16_t port, RedisStoreOptions options)
    : Store(options.timeout), impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->port = port;
  impl_->options = std::move(options);
}

RedisStore::~RedisStore() = default;

void RedisStore::set(const std::string& key, const std::string& value) {
  impl_->command({"SET", impl_->key(key), value}, "set '" + key + "'", timeout());
}

std::string RedisStore::get(const std::string& key) {
  wait({key}, timeout());
  Reply r = impl_->command({"GET", impl_->key(key)}, "get '" + key + "'", timeout());
  if (r->type != REDIS_REPLY_STRING) throw detail::store_timeout("RedisStore", timeout(), {key});
  return std::string(r->str, r->len);
}

int64_t RedisStore::add(const std::string& key, int64_t delta) {
  try {
    Reply r = impl_->command({"INCRBY", impl_->key(key), std::to_string(delta)},
                             "add '" + key + "'", timeout());
    return r->integer;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidUsage) throw;
    // Not a counter, or a sum that overflows: say so as every store does, naming the key.
    Reply v = impl_->command({"GET", impl_->key(key)}, "get '" + key + "'", timeout());
    const std::string value = v->type == REDIS_REPLY_STRING ? std::string(v->str, v->len) : "";
    detail::add_to_counter(key, &value, delta);  // throws for either
    throw;                                       // Redis refused it for another reason
  }
}

std::string RedisStore::compare_set(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  Reply r = impl_->command({"EVAL", kCompareSetScript, "1", impl_->key(key), expected, desired},
                           "compare_set '" + key + "'", timeout());
  return std::string(r->str, r->len);
}

void RedisStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = detail::deadline_after(timeout);
  auto pause = std::chrono::microseconds(200);
  while (true) {
    if (check(keys)) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw detail::store_timeout("RedisStore", timeout, detail::missing_keys(*this, keys));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

bool RedisStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  std::vector<std::string> args = {"EXISTS"};
  for (const auto& k : keys) args.push_back(impl_->key(k));
  Reply r = impl_->command(args, "check", timeout());
  return r->integer == static_cast<long long>(keys.size());
}

bool RedisStore::delete_key(const std::string& key) {
  Reply r = impl_->command({"DEL", impl_->key(key)}, "delete '" + key + "'", timeout());
  return r->integer > 0;
}

int64_t RedisStore::num_keys() {
  int64_t count = 0;
  std::string cursor = "0";
  do {
    Reply r =
        impl_->command({"SCAN", cursor, "MATCH", impl_->options.prefix + "*", "COUNT", "1000"},
                       "num_keys", timeout());
    cursor = std::string(r->element[0]->str, r->element[0]->len);
    count += static_cast<int64_t>(r->element[1]->elements);
  } while (cursor != "0");
  return count;
}

#else  // !TUTTI_HAVE_HIREDIS

struct RedisStore::Impl {};

RedisStore::RedisStore(std::string host, uint16_t port, RedisStoreOptions options)
    : Store(options.timeout) {
  throw Error(ErrorCode::kUnavailable, "RedisStore " + host + ":" + std::to_string(port) +
                                           ": tutti was built without hiredis");
}
RedisStore::~RedisStore() = default;
void RedisStore::set(const std::string&, const std::string&) {}
std::string RedisStore::get(const std::string&) {
  return {};
}
int64_t RedisStore::add(const std::string&, int64_t) {
  return 0;
}
std::string RedisStore::compare_set(const std::string&, const std::string&, const std::string&) {
  return {};
}
void RedisStore::wait(const std::vector<std::string>&, std::chrono::milliseconds) {}
bool RedisStore::check(const std::vector<std::string>&) {
  return false;
}
bool RedisStore::delete_key(const std::string&) {
  return false;
}
int64_t RedisStore::num_keys() {
  return 0;
}

#endif

}  // namespace tutti
