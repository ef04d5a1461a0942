import os, sys, time, threading, subprocess
mnt = sys.argv[1]
lat = []
stop = False
def loop():
    i = 0
    while not stop:
        p = os.path.join(mnt, 'probe-%d' % (i % 8))
        t = time.perf_counter()
        fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
        os.close(fd)
        os.unlink(p)
        lat.append(time.perf_counter() - t)
        i += 1
th = threading.Thread(target=loop); th.start()
time.sleep(0.5)
subprocess.run(['dd', 'if=/dev/zero', 'of=' + os.path.join(mnt, 'big'), 'bs=1M', 'count=256', 'conv=fsync', 'status=none'], check=True)
time.sleep(6)  # the maintenance thread's checkpoint after the budget
stop = True; th.join()
lat.sort()
print('loops %d  p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms  worst %.1f ms' % (len(lat), lat[len(lat)//2]*1e3, lat[int(len(lat)*0.99)]*1e3, lat[int(len(lat)*0.999)]*1e3, lat[-1]*1e3))
