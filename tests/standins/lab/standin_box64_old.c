/*
 * STAND-IN for an old box64 (v0.2.6 and earlier), for the board lab's negative test only.
 *
 * Those releases fixed the page size at build time (4096) and abort at start on a 16 KB or
 * 64 KB-page kernel; they are no longer in any reachable package registry, so this program
 * reproduces the two behaviours provisioning must tell apart: `-v` succeeds and prints a
 * plausible version string (so a version check alone proves nothing), while running any
 * program aborts with the documented message and rc 255 when the real page size is not 4096.
 * It emulates nothing: on a 4 KB-page kernel it says so and fails.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CONFIGURED_PAGE_SIZE 4096L

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        printf("Box64 with Dynarec v0.2.6 standin built on Jan  1 2024 00:00:00 "
               "(torch-fl stand-in for an old box64)\n");
        return 0;
    }
    long page = sysconf(_SC_PAGESIZE);
    if (page != CONFIGURED_PAGE_SIZE) {
        /* old box64 printed this through its log stream, which is stdout by default */
        printf("Error: PageSize configuration is wrong: configured with %ld, but got %ld\n",
               CONFIGURED_PAGE_SIZE, page);
        fflush(stdout);
        return 255;
    }
    fprintf(stderr, "box64 stand-in: cannot emulate anything (this is a test stand-in)\n");
    return 1;
}
