// Core-to-core cache-line round trip on this machine (docs/asap.md, "Transfer speed at 2 ranks").
// Build and run: gcc -O2 -pthread benches/c2c.c -o /tmp/c2c && /tmp/c2c
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static _Alignas(64) atomic_long flag;
#define N 200000
static double ns[N];
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void *pong(void *a){pin(1);for(long i=0;i<N;i++){while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+1);atomic_store_explicit(&flag,2*i+2,memory_order_release);}return 0;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(){pthread_t t;pin(0);pthread_create(&t,0,pong,0);struct timespec a,b;
for(long i=0;i<N;i++){clock_gettime(CLOCK_MONOTONIC,&a);atomic_store_explicit(&flag,2*i+1,memory_order_release);while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+2);clock_gettime(CLOCK_MONOTONIC,&b);ns[i]=(b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec);}
pthread_join(t,0);qsort(ns,N,sizeof ns[0],cmp);printf("c2c round trip p10 %.0f ns median %.0f ns\n",ns[N/10],ns[N/2]);}
