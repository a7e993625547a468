// The driver calls the pool makes, from one thread and from several at once:
// each thread binds the primary context (cudaFree(0)) and a stream of its own,
// then makes n calls of each kind; prints ns a call (the slowest thread's) and the
// voluntary context switches (sleeps on a lock in the driver). Usage: driver_threads THREADS N
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static long n; static int which; static long vcsw[64]; static double took[64];
static pthread_barrier_t go;
static void *run(void *a){
  long i=(long)a; cudaFree(0); unsigned long long id; CUcontext c; CUstream s=0; int st;
  cudaStreamCreateWithFlags((cudaStream_t*)&s, cudaStreamNonBlocking);
  pthread_barrier_wait(&go);
  struct rusage u0,u1; getrusage(RUSAGE_THREAD,&u0); double t=now();
  for(long k=0;k<n;k++){
    if(which==0) cuCtxGetId(0,&id); else if(which==1) cuCtxGetCurrent(&c); else cuStreamIsCapturing(s,(CUstreamCaptureStatus*)&st);
  }
  took[i]=now()-t; getrusage(RUSAGE_THREAD,&u1); vcsw[i]=u1.ru_nvcsw-u0.ru_nvcsw; return 0;
}
int main(int argc,char**argv){
  n=atol(argv[2]); const char*names[]={"cuCtxGetId","cuCtxGetCurrent","cuStreamIsCapturing"};
  for(which=0;which<3;which++){
    int T=atoi(argv[1]); pthread_t th[64]; pthread_barrier_init(&go,0,T);
    for(long i=0;i<T;i++) pthread_create(&th[i],0,run,(void*)i);
    double worst=0; long sw=0; for(int i=0;i<T;i++){pthread_join(th[i],0); if(took[i]>worst)worst=took[i]; sw+=vcsw[i];}
    printf("%-20s threads=%d ns_per_call=%.1f vcsw=%ld\n",names[which],T,worst/n,sw);
    pthread_barrier_destroy(&go);
  }
}
