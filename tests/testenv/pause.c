/* The pod sandbox's "pause" process for the test node (built by tests/testenv/images.py).
 *
 * It holds the pod's namespaces open: it blocks until SIGINT or SIGTERM, then exits 0, and as
 * PID 1 of the pod it reaps every orphan that is re-parented to it (SIGCHLD). Same job as
 * kubernetes' build/pause/linux/pause.c, written short. Built with gcc -static -O2.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  int saved = errno;
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  errno = saved;
}

int main(int argc, char **argv) {
  struct sigaction stop, child;

  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("pause (kube-rendezvous test node)");
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not running as PID 1\n");
  memset(&stop, 0, sizeof stop);
  memset(&child, 0, sizeof child);
  stop.sa_handler = on_stop;
  child.sa_handler = on_child;
  child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) pause();
}
