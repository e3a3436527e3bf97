// The SIGBUS guard: a handler installed once, and a per-thread range and jump buffer it checks.
#include "tandem/core/mapped_read.h"

#include <csetjmp>
#include <csignal>
#include <mutex>

namespace tandem {
namespace {

struct sigaction g_previous;
thread_local sigjmp_buf* t_jump = nullptr;
thread_local const char* t_begin = nullptr;
thread_local const char* t_end = nullptr;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto* at = static_cast<const char*>(info->si_addr);
  if (t_jump != nullptr && at >= t_begin && at < t_end) siglongjmp(*t_jump, 1);
  // Not a guarded read: what SIGBUS did before.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
  }
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  // SA_NODEFER: leaving the handler by a jump leaves SIGBUS unblocked, with no mask to restore.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

bool guarded_mapped_read(const void* begin, size_t bytes, void (*read)(void*), void* context) {
  static std::once_flag once;
  std::call_once(once, install);
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) {
    t_jump = nullptr;
    return false;
  }
  t_begin = static_cast<const char*>(begin);
  t_end = t_begin + bytes;
  t_jump = &jump;
  read(context);
  t_jump = nullptr;
  return true;
}

}  // namespace tandem
