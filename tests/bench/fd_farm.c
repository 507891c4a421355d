/*
 * fd_farm COUNT FDS HOLDERS DEVICE FILLER...
 * Forks COUNT small processes; each opens FDS descriptors on the FILLER files (round robin), and the first HOLDERS of
 * them also open DEVICE. Prints the children's pids, one per line, then "ready", and waits; on SIGTERM it kills
 * them all. Used to measure a /proc holder scan against fuser with many processes and descriptors.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t *children;
static int count;

static void stop(int signum)
{
    (void)signum;
    for (int i = 0; i < count; i++)
        kill(children[i], SIGKILL);
    while (wait(NULL) > 0)
        ;
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: fd_farm COUNT FDS HOLDERS DEVICE FILLER...\n");
        return 2;
    }
    count = atoi(argv[1]);
    int fds = atoi(argv[2]), holders = atoi(argv[3]), fillers = argc - 5;
    children = calloc((size_t)count, sizeof(pid_t));
    signal(SIGTERM, stop);
    for (int i = 0; i < count; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            signal(SIGTERM, SIG_DFL);
            for (int f = 0; f < fds; f++)
                if (open(argv[5 + f % fillers], O_RDONLY) < 0)
                    _exit(1);
            if (i < holders && open(argv[4], O_RDONLY) < 0)
                _exit(1);
            for (;;)
                pause();
        }
        children[i] = pid;
        printf("%d\n", pid);
    }
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}
