/*
 * Simulated libnvidia-ml.so.1 for gpufleet.serving tests and the simulated lab.
 *
 * It implements the subset of the NVML C API that nvidia-ml-py calls for
 * inventory, memory and process queries. The state is re-read from a text
 * file on every call, so a test (or an engine double) can change it while a
 * module is polling. See tests/sim/nvml_sim.py for the writer side.
 *
 * Like the real library, an initialised NVML holds the driver's device files open (nvidiactl, nvidia-uvm and
 * nvidia<minor> of every GPU) until nvmlShutdown: $GPUFLEET_SIM_NVML_DEV names their directory (default /dev);
 * files that do not exist there are skipped.
 *
 * State root: $GPUFLEET_SIM_NVML_ROOT (default /run/gpufleet-sim/nvml)
 *   state        global and per-GPU lines (format in nvml_sim.py)
 *   alloc/       one file per allocation: memory that stays used while any
 *                of its holder processes is alive, as the driver keeps a
 *                context alive while any process holds its file descriptors.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_FAULTS 32
#define MAX_PROCS 256
#define MIB (1024ULL * 1024ULL)

typedef struct {
    unsigned int index;
    unsigned int minor;
    char uuid[96];
    char name[96];
    char bus_id[32];
    unsigned long long total_mib;
    unsigned long long reserved_mib;
    unsigned long long leaked_mib;
    int status; /* NVML_SUCCESS, or the error every per-device call returns */
} sim_gpu;

typedef struct {
    char function[64];
    int code;              /* -1: hang forever */
    unsigned int delay_ms; /* answer, but only after this long (a driver initialising without persistence mode) */
} sim_fault;

typedef struct {
    unsigned int pid;
    unsigned long long used_bytes;
} sim_process;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef sim_gpu *nvmlDevice_t;

static sim_gpu gpus[MAX_GPUS];
static unsigned int gpu_count;
static sim_fault faults[MAX_FAULTS];
static unsigned int fault_count;
static char driver_version[80] = "580.159.04";
static int initialized;
static int device_fds[MAX_GPUS + 2];
static unsigned int device_fd_count;

static const char *state_root(void)
{
    const char *root = getenv("GPUFLEET_SIM_NVML_ROOT");
    return (root && *root) ? root : "/run/gpufleet-sim/nvml";
}

static int status_from_word(const char *word)
{
    if (strcmp(word, "lost") == 0)
        return NVML_ERROR_GPU_IS_LOST;
    if (strcmp(word, "reset_required") == 0)
        return NVML_ERROR_RESET_REQUIRED;
    return NVML_SUCCESS;
}

/* "gpu index=0 minor=3 uuid=GPU-x bus_id=... total_mib=.. reserved_mib=.. leaked_mib=.. status=ok name=rest of line" */
static void parse_gpu_line(char *line)
{
    if (gpu_count >= MAX_GPUS)
        return;
    sim_gpu *g = &gpus[gpu_count];
    memset(g, 0, sizeof(*g));
    g->index = gpu_count;
    char *name = strstr(line, " name=");
    if (name) {
        *name = '\0';
        snprintf(g->name, sizeof(g->name), "%s", name + 6);
    }
    char *save = NULL;
    for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq)
            continue;
        *eq = '\0';
        const char *value = eq + 1;
        if (strcmp(tok, "minor") == 0)
            g->minor = (unsigned int)strtoul(value, NULL, 10);
        else if (strcmp(tok, "uuid") == 0)
            snprintf(g->uuid, sizeof(g->uuid), "%s", value);
        else if (strcmp(tok, "bus_id") == 0)
            snprintf(g->bus_id, sizeof(g->bus_id), "%s", value);
        else if (strcmp(tok, "total_mib") == 0)
            g->total_mib = strtoull(value, NULL, 10);
        else if (strcmp(tok, "reserved_mib") == 0)
            g->reserved_mib = strtoull(value, NULL, 10);
        else if (strcmp(tok, "leaked_mib") == 0)
            g->leaked_mib = strtoull(value, NULL, 10);
        else if (strcmp(tok, "status") == 0)
            g->status = status_from_word(value);
    }
    gpu_count++;
}

/* "fault function=nvmlDeviceGetMemoryInfo_v2 result=hang|slow:<ms>|<nvml error code>" */
static void parse_fault_line(char *line)
{
    if (fault_count >= MAX_FAULTS)
        return;
    sim_fault *f = &faults[fault_count];
    memset(f, 0, sizeof(*f));
    char *save = NULL;
    for (char *tok = strtok_r(line, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (strncmp(tok, "function=", 9) == 0)
            snprintf(f->function, sizeof(f->function), "%s", tok + 9);
        else if (strncmp(tok, "result=slow:", 12) == 0)
            f->delay_ms = (unsigned int)strtoul(tok + 12, NULL, 10);
        else if (strncmp(tok, "result=", 7) == 0)
            f->code = strcmp(tok + 7, "hang") == 0 ? -1 : atoi(tok + 7);
    }
    if (f->function[0])
        fault_count++;
}

static void load_state(void)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/state", state_root());
    gpu_count = 0;
    fault_count = 0;
    FILE *fp = fopen(path, "r");
    if (!fp)
        return;
    char line[1024];
    while (fgets(line, sizeof(line), fp)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (strncmp(line, "gpu ", 4) == 0)
            parse_gpu_line(line + 4);
        else if (strncmp(line, "fault ", 6) == 0)
            parse_fault_line(line + 6);
        else if (strncmp(line, "driver_version=", 15) == 0)
            snprintf(driver_version, sizeof(driver_version), "%.79s", line + 15);
    }
    fclose(fp);
}

/* Applies an injected fault for this function: hang forever, or return a code. */
static int injected_fault(const char *function)
{
    load_state();
    for (unsigned int i = 0; i < fault_count; i++) {
        if (strcmp(faults[i].function, function) != 0)
            continue;
        if (faults[i].code < 0)
            for (;;)
                pause();
        if (faults[i].delay_ms) {
            struct timespec delay = {faults[i].delay_ms / 1000, (long)(faults[i].delay_ms % 1000) * 1000000L};
            nanosleep(&delay, NULL);
        }
        return faults[i].code;
    }
    return NVML_SUCCESS;
}

#define FAULT_POINT(fn)                     \
    do {                                    \
        int injected__ = injected_fault(fn); \
        if (injected__ != NVML_SUCCESS)     \
            return injected__;              \
    } while (0)

static int device_check(nvmlDevice_t device)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (device < gpus || device >= gpus + MAX_GPUS || (unsigned int)(device - gpus) >= gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return device->status;
}

/* A holder is alive while its thread group lives: a zombie leader with live threads still counts. */
static int holder_alive(unsigned int pid, unsigned long long start_time)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    char *close_paren = strrchr(buf, ')');
    if (!close_paren || close_paren[1] == '\0')
        return 0;
    char state = close_paren[2];
    /* field 22 (starttime) is the 20th field after the state */
    char *p = close_paren + 2;
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    if (start_time && (!p || strtoull(p, NULL, 10) != start_time))
        return 0;
    if (state != 'Z' && state != 'X')
        return 1;
    snprintf(path, sizeof(path), "/proc/%u/task", pid);
    DIR *tasks = opendir(path);
    if (!tasks)
        return 0;
    int threads = 0;
    struct dirent *entry;
    while ((entry = readdir(tasks)))
        if (entry->d_name[0] != '.')
            threads++;
    closedir(tasks);
    return threads > 1;
}

/*
 * Memory the driver frees some time after its last holder exited (pinned host memory, driver teardown):
 * the first reader that sees every holder gone records the time in a dot file next to the allocation.
 */
static int still_lingering(const char *dir_path, const char *name, unsigned long long linger_ms)
{
    char marker[8192];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    unsigned long long now_ms = (unsigned long long)now.tv_sec * 1000ULL + (unsigned long long)now.tv_nsec / 1000000ULL;
    snprintf(marker, sizeof(marker), "%s/.%s.gone", dir_path, name);
    FILE *fp = fopen(marker, "r");
    unsigned long long gone_ms = 0;
    if (fp) {
        if (fscanf(fp, "%llu", &gone_ms) != 1)
            gone_ms = now_ms;
        fclose(fp);
    } else {
        fp = fopen(marker, "w");
        if (fp) {
            fprintf(fp, "%llu\n", now_ms);
            fclose(fp);
        }
        gone_ms = now_ms;
    }
    return now_ms - gone_ms < linger_ms;
}

/*
 * Allocation file: "gpu=<index> mib=<n> pid=<reported pid> kind=compute|graphics holder=<pid>:<start> ... [linger_ms=N] [leak=1]
 *                   [unknown_used=1]"
 * Counts while a holder lives (then linger_ms more), or forever with leak=1; reports `pid`, which may be a
 * dead process (stale NVML PID).
 */
static int read_allocations(unsigned int gpu_index, const char *kind, sim_process *out, unsigned int max_out,
                            unsigned long long *used_bytes)
{
    char dir_path[4096];
    snprintf(dir_path, sizeof(dir_path), "%s/alloc", state_root());
    DIR *dir = opendir(dir_path);
    unsigned int count = 0;
    *used_bytes = 0;
    if (!dir)
        return 0;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        if (entry->d_name[0] == '.')
            continue;
        char path[8192], line[2048];
        snprintf(path, sizeof(path), "%s/%s", dir_path, entry->d_name);
        FILE *fp = fopen(path, "r");
        if (!fp)
            continue;
        char *got = fgets(line, sizeof(line), fp);
        fclose(fp);
        if (!got)
            continue;
        unsigned int gpu = ~0U, pid = 0;
        unsigned long long mib = 0, linger_ms = 0;
        int alive = 0, leak = 0, unknown_used = 0;
        char alloc_kind[16] = "compute";
        char *save = NULL;
        for (char *tok = strtok_r(line, " \r\n", &save); tok; tok = strtok_r(NULL, " \r\n", &save)) {
            if (strncmp(tok, "gpu=", 4) == 0)
                gpu = (unsigned int)strtoul(tok + 4, NULL, 10);
            else if (strncmp(tok, "mib=", 4) == 0)
                mib = strtoull(tok + 4, NULL, 10);
            else if (strncmp(tok, "pid=", 4) == 0)
                pid = (unsigned int)strtoul(tok + 4, NULL, 10);
            else if (strncmp(tok, "linger_ms=", 10) == 0)
                linger_ms = strtoull(tok + 10, NULL, 10);
            else if (strcmp(tok, "leak=1") == 0)
                leak = 1;
            else if (strcmp(tok, "unknown_used=1") == 0)
                unknown_used = 1; /* listed as NVML_VALUE_NOT_AVAILABLE, still counted in the GPU's total */
            else if (strncmp(tok, "kind=", 5) == 0)
                snprintf(alloc_kind, sizeof(alloc_kind), "%s", tok + 5);
            else if (strncmp(tok, "holder=", 7) == 0) {
                char *colon = strchr(tok + 7, ':');
                unsigned long long start = colon ? strtoull(colon + 1, NULL, 10) : 0;
                alive |= holder_alive((unsigned int)strtoul(tok + 7, NULL, 10), start);
            }
        }
        if (!alive && !leak && linger_ms)
            alive = still_lingering(dir_path, entry->d_name, linger_ms);
        if (gpu != gpu_index || !(alive || leak))
            continue;
        *used_bytes += mib * MIB;
        if (kind && strcmp(kind, alloc_kind) != 0)
            continue;
        int merged = 0;
        unsigned long long listed = unknown_used ? ~0ULL : mib * MIB;
        for (unsigned int i = 0; i < count; i++) {
            if (out[i].pid == pid) {
                out[i].used_bytes = (unknown_used || out[i].used_bytes == ~0ULL) ? ~0ULL : out[i].used_bytes + listed;
                merged = 1;
            }
        }
        if (!merged && count < max_out) {
            out[count].pid = pid;
            out[count].used_bytes = listed;
            count++;
        }
    }
    closedir(dir);
    return (int)count;
}

static void open_device_files(void)
{
    const char *dir = getenv("GPUFLEET_SIM_NVML_DEV");
    char path[4096];
    if (!dir || !*dir)
        dir = "/dev";
    device_fd_count = 0;
    for (unsigned int i = 0; i < gpu_count + 2; i++) {
        if (i < gpu_count)
            snprintf(path, sizeof(path), "%s/nvidia%u", dir, gpus[i].minor);
        else
            snprintf(path, sizeof(path), "%s/%s", dir, i == gpu_count ? "nvidiactl" : "nvidia-uvm");
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            device_fds[device_fd_count++] = fd;
    }
}

static void close_device_files(void)
{
    while (device_fd_count)
        close(device_fds[--device_fd_count]);
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    FAULT_POINT("nvmlInitWithFlags");
    load_state();
    if (!initialized)
        open_device_files();
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    close_device_files();
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    FAULT_POINT("nvmlSystemGetDriverVersion");
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (strlen(driver_version) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(version, length, "%s", driver_version);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    FAULT_POINT("nvmlDeviceGetCount_v2");
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    FAULT_POINT("nvmlDeviceGetHandleByIndex_v2");
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    FAULT_POINT("nvmlDeviceGetHandleByUUID");
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; i < gpu_count; i++) {
        if (strcmp(gpus[i].uuid, uuid) == 0) {
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t copy_string(const char *value, char *out, unsigned int length)
{
    if (strlen(value) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(out, length, "%s", value);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    FAULT_POINT("nvmlDeviceGetUUID");
    int rc = device_check(device);
    return rc ? rc : copy_string(device->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    FAULT_POINT("nvmlDeviceGetName");
    int rc = device_check(device);
    return rc ? rc : copy_string(device->name, name, length);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    FAULT_POINT("nvmlDeviceGetIndex");
    int rc = device_check(device);
    if (!rc)
        *index = device->index;
    return rc;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor)
{
    FAULT_POINT("nvmlDeviceGetMinorNumber");
    int rc = device_check(device);
    if (!rc)
        *minor = device->minor;
    return rc;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    FAULT_POINT("nvmlDeviceGetPciInfo_v3");
    int rc = device_check(device);
    if (rc)
        return rc;
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busId, sizeof(pci->busId), "%s", device->bus_id);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%.15s", device->bus_id);
    sscanf(device->bus_id, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
    pci->pciDeviceId = 0x233510DE;
    return NVML_SUCCESS;
}

static nvmlReturn_t memory_totals(nvmlDevice_t device, unsigned long long *used_bytes)
{
    sim_process ignored[MAX_PROCS];
    read_allocations(device->index, NULL, ignored, MAX_PROCS, used_bytes);
    *used_bytes += device->leaked_mib * MIB;
    unsigned long long ceiling = (device->total_mib - device->reserved_mib) * MIB;
    if (*used_bytes > ceiling)
        *used_bytes = ceiling;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    FAULT_POINT("nvmlDeviceGetMemoryInfo_v2");
    int rc = device_check(device);
    if (rc)
        return rc;
    unsigned long long used;
    memory_totals(device, &used);
    memory->total = device->total_mib * MIB;
    memory->reserved = device->reserved_mib * MIB;
    memory->used = used;
    memory->free = memory->total - memory->reserved - used;
    return NVML_SUCCESS;
}

/* v1 reports the driver reserve as used, as real drivers do. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    FAULT_POINT("nvmlDeviceGetMemoryInfo");
    int rc = device_check(device);
    if (rc)
        return rc;
    unsigned long long used;
    memory_totals(device, &used);
    memory->total = device->total_mib * MIB;
    memory->used = used + device->reserved_mib * MIB;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

static nvmlReturn_t running_processes(const char *function, const char *kind, nvmlDevice_t device,
                                      unsigned int *count, nvmlProcessInfo_t *infos)
{
    FAULT_POINT(function);
    int rc = device_check(device);
    if (rc)
        return rc;
    sim_process procs[MAX_PROCS];
    unsigned long long used;
    int found = read_allocations(device->index, kind, procs, MAX_PROCS, &used);
    if (infos == NULL || *count < (unsigned int)found) {
        unsigned int capacity = infos ? *count : 0;
        *count = (unsigned int)found;
        return (found == 0 && capacity == 0) ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < found; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory = procs[i].used_bytes;
        infos[i].gpuInstanceId = 0xFFFFFFFF;
        infos[i].computeInstanceId = 0xFFFFFFFF;
    }
    *count = (unsigned int)found;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return running_processes("nvmlDeviceGetComputeRunningProcesses_v3", "compute", device, count, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return running_processes("nvmlDeviceGetGraphicsRunningProcesses_v3", "graphics", device, count, infos);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    return running_processes("nvmlDeviceGetMPSComputeRunningProcesses_v3", "mps", device, count, infos);
}

/* MIG is not simulated: report it as unsupported, as GPUs without MIG do. */
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    (void)current;
    (void)pending;
    FAULT_POINT("nvmlDeviceGetMigMode");
    int rc = device_check(device);
    return rc ? rc : NVML_ERROR_NOT_SUPPORTED;
}
