/*
 * nccl.cu: the collectives of the tensor-parallel dense layers (runtime/tp.c) over NCCL, which
 * is loaded at run time (dlopen of libnccl.so.2, MOET_NCCL_LIB to name another file): the
 * binary runs on machines without NCCL, and only a tensor-parallel open asks for it.
 *
 * One process drives every rank (ncclCommInitAll over CUDA devices 0..n-1), so each exchange
 * is one NCCL group: broadcast from rank 0 to all, or each rank's buffer sent to rank 0. Both
 * are copies: nothing is reduced, so the bits received are the bits sent.
 * NOTE: NVLink multicast (NVLS) stays off (NCCL_NVLS_ENABLE=0 unless the caller set it): the
 * exchanges here are copies that do not need it, and the shared GPU machines must not use it.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#include "gpu_int.h"
#include "moet_gpu_host.h"

typedef ncclResult_t (*fn_init_all)(ncclComm_t *, int, const int *);
typedef ncclResult_t (*fn_destroy)(ncclComm_t);
typedef ncclResult_t (*fn_group)(void);
typedef ncclResult_t (*fn_bcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
				 cudaStream_t);
typedef ncclResult_t (*fn_send)(const void *, size_t, ncclDataType_t, int, ncclComm_t,
				cudaStream_t);
typedef ncclResult_t (*fn_recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef const char *(*fn_errstr)(ncclResult_t);
typedef ncclResult_t (*fn_version)(int *);

struct moet_nccl {
	void *lib;
	int n;
	int dev[MOET_NCCL_MAX];
	ncclComm_t comm[MOET_NCCL_MAX];
	fn_init_all init_all;
	fn_destroy destroy;
	fn_group group_start, group_end;
	fn_bcast bcast;
	fn_send send;
	fn_recv recv;
	fn_errstr errstr;
	fn_version version;
	int ver;
};

static int nccl_fail(const moet_nccl *nc, const char *what, ncclResult_t r)
{
	return moet_err(MOET_EDEVICE, "NCCL %s: %s (error %d)", what,
			nc->errstr ? nc->errstr(r) : "?", (int)r);
}

#define NCCL_TRY(nc, what, call)                                                          \
	do {                                                                              \
		ncclResult_t r_ = (call);                                                 \
		if (r_ != ncclSuccess)                                                    \
			return nccl_fail(nc, what, r_);                                   \
	} while (0)

extern "C" void moet_nccl_destroy(moet_nccl *nc)
{
	if (!nc)
		return;
	for (int r = 0; r < nc->n; r++)
		if (nc->comm[r])
			nc->destroy(nc->comm[r]);
	if (nc->lib)
		dlclose(nc->lib);
	free(nc);
}

static int load(moet_nccl *nc)
{
	const char *path = getenv("MOET_NCCL_LIB");
	if (!path || !*path)
		path = "libnccl.so.2";
	if (!(nc->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL))) {
		const char *why = dlerror();
		return moet_err(MOET_EUNSUP, "tensor-parallel dense layers need NCCL: cannot load "
				"%s (%s); install libnccl2 or name the library in MOET_NCCL_LIB",
				path, why ? why : "?");
	}
	const struct {
		void **fn;
		const char *name;
	} sym[] = {
		{ (void **)&nc->init_all, "ncclCommInitAll" },
		{ (void **)&nc->destroy, "ncclCommDestroy" },
		{ (void **)&nc->group_start, "ncclGroupStart" },
		{ (void **)&nc->group_end, "ncclGroupEnd" },
		{ (void **)&nc->bcast, "ncclBroadcast" },
		{ (void **)&nc->send, "ncclSend" },
		{ (void **)&nc->recv, "ncclRecv" },
		{ (void **)&nc->errstr, "ncclGetErrorString" },
		{ (void **)&nc->version, "ncclGetVersion" },
	};
	for (size_t i = 0; i < sizeof(sym) / sizeof(sym[0]); i++)
		if (!(*sym[i].fn = dlsym(nc->lib, sym[i].name)))
			return moet_err(MOET_EUNSUP, "%s has no %s (NCCL 2.7 or later needed)", path,
					sym[i].name);
	return 0;
}

extern "C" int moet_nccl_create(int n, moet_nccl **out)
{
	*out = NULL;
	if (n < 2 || n > MOET_NCCL_MAX)
		return moet_err(MOET_EINVAL, "NCCL: %d ranks (2 to %d)", n, MOET_NCCL_MAX);
	moet_nccl *nc = (moet_nccl *)calloc(1, sizeof(*nc));
	if (!nc)
		return moet_err(MOET_ENOMEM, "NCCL state");
	nc->n = n;
	for (int r = 0; r < n; r++)
		nc->dev[r] = r;
	int rc = load(nc);
	if (!rc) {
		setenv("NCCL_NVLS_ENABLE", "0", 0);
		ncclResult_t r = nc->version(&nc->ver);
		if (r == ncclSuccess)
			r = nc->init_all(nc->comm, n, nc->dev);
		int r0 = moet_gpu_set_device(nc->dev[0]);
		if (r == ncclSuccess && r0)
			rc = r0;
		else if (r != ncclSuccess) {
			memset(nc->comm, 0, sizeof(nc->comm));
			rc = nccl_fail(nc, "ncclCommInitAll", r);
		}
	}
	if (rc) {
		moet_nccl_destroy(nc);
		return rc;
	}
	*out = nc;
	return 0;
}

extern "C" int moet_nccl_version(const moet_nccl *nc)
{
	return nc->ver;
}

/* Group end with the device given back to rank 0 (NCCL may switch it while enqueuing). */
static int group_end(moet_nccl *nc, const char *what)
{
	ncclResult_t r = nc->group_end();
	int rc = moet_gpu_set_device(nc->dev[0]);
	if (r != ncclSuccess)
		return nccl_fail(nc, what, r);
	return rc;
}

extern "C" int moet_nccl_bcast(moet_nccl *nc, void *const buf[], size_t count,
			       void *const stream[])
{
	if (count == 0)
		return 0;
	NCCL_TRY(nc, "group start", nc->group_start());
	for (int r = 0; r < nc->n; r++) {
		ncclResult_t e = nc->bcast(buf[r], buf[r], count, ncclFloat32, 0, nc->comm[r],
					   (cudaStream_t)stream[r]);
		if (e != ncclSuccess) {
			(void)group_end(nc, "broadcast");
			return nccl_fail(nc, "ncclBroadcast", e);
		}
	}
	return group_end(nc, "broadcast");
}

extern "C" int moet_nccl_gather(moet_nccl *nc, void *const send[], void *const recv[],
				const size_t count[], void *const stream[])
{
	NCCL_TRY(nc, "group start", nc->group_start());
	for (int r = 1; r < nc->n; r++) {
		if (count[r] == 0)
			continue;
		ncclResult_t e = nc->send(send[r], count[r], ncclFloat32, 0, nc->comm[r],
					  (cudaStream_t)stream[r]);
		if (e == ncclSuccess)
			e = nc->recv(recv[r], count[r], ncclFloat32, r, nc->comm[0],
				     (cudaStream_t)stream[0]);
		if (e != ncclSuccess) {
			(void)group_end(nc, "gather");
			return nccl_fail(nc, "ncclSend/ncclRecv", e);
		}
	}
	return group_end(nc, "gather");
}
