// The offline cache. `keras-vit app mobile` fills in PRECACHE: every file the app needs
// and a version made from their contents, so a new model or app installs a new cache.
const PRECACHE = __PRECACHE__;
const CACHE = `keras-vit-${PRECACHE.version}`;

self.addEventListener('install', (event) => {
  event.waitUntil(
    caches.open(CACHE)
      .then((cache) => cache.addAll(PRECACHE.files.map((file) => new Request(file, {cache: 'reload'}))))
      .then(() => self.skipWaiting()),
  );
});

self.addEventListener('activate', (event) => {
  event.waitUntil(
    caches.keys()
      .then((keys) => Promise.all(keys.filter((key) => key.startsWith('keras-vit-') && key !== CACHE).map((key) => caches.delete(key))))
      .then(() => self.clients.claim()),
  );
});

// Cache first: the app opens without a network; anything not cached goes to the network.
self.addEventListener('fetch', (event) => {
  if (event.request.method !== 'GET') return;
  event.respondWith(
    caches.open(CACHE).then(async (cache) => {
      const cached = await cache.match(event.request, {ignoreSearch: true});
      return cached || fetch(event.request);
    }),
  );
});
