// hold_port: a free TCP port for a test, without the race of probing for
// one. Binds 127.0.0.1:0 with SO_REUSEADDR, without listening, prints the
// port, and holds it while its parent (the test script) lives. Held so, the
// port is neither handed to another bind(0) nor used as the source port of
// an outgoing connection, while a ztrain rank 0, which binds with
// SO_REUSEADDR, can still listen on it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

int main() {
  const pid_t parent = ::getppid();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("hold_port");
    return 1;
  }
  std::printf("%d\n", ntohs(a.sin_port));
  std::fflush(stdout);
  while (::getppid() == parent) ::usleep(100000);
  return 0;
}
