// A module resolution hook: @anycable/serverless-js 0.1.0 is published for
// bundlers, with directory imports ('./rpc') that Node's ES module loader
// refuses. This resolves such an import to the directory's index.js, so the
// library runs unchanged in Node.
export async function resolve(specifier, context, next) {
  try {
    return await next(specifier, context);
  } catch (e) {
    if (e?.code === 'ERR_UNSUPPORTED_DIR_IMPORT' || e?.code === 'ERR_MODULE_NOT_FOUND') {
      if (specifier.startsWith('.')) {
        for (const suffix of ['/index.js', '.js']) {
          try {
            return await next(specifier + suffix, context);
          } catch {}
        }
      }
    }
    throw e;
  }
}
