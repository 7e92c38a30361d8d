/* The pod sandbox's process (the image containerd and the kubelet call the "pause" or sandbox image): it holds
 * the pod's namespaces open and does nothing else. Blocks in pause(), reaps any child that is re-parented to it
 * (it is PID 1 when the pod shares its process namespace) and exits 0 on SIGINT or SIGTERM.
 * Built by e2e/lab/images.py:  gcc -static -O2 -s -o pause pause.c
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal_number) {
    (void)signal_number;
    _exit(0);
}

static void reap(int signal_number) {
    (void)signal_number;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static void handle(int signal_number, void (*handler)(int), int flags) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    if (sigaction(signal_number, &action, NULL) < 0) {
        perror("sigaction");
        _exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("pause (pagoda e2e/lab/dockerfiles/pause.c)");
        return 0;
    }
    handle(SIGINT, stop, 0);
    handle(SIGTERM, stop, 0);
    handle(SIGCHLD, reap, SA_NOCLDSTOP | SA_RESTART);
    for (;;) {
        pause();
    }
}
