#include "core/host_name.h"

#include <unistd.h>

namespace ztrain {

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace ztrain
