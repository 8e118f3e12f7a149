// Bundles the dashboard into dist/ (read by crates/server/build.rs and embedded in the binary).
import * as esbuild from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";

rmSync("dist", { recursive: true, force: true });
mkdirSync("dist/assets", { recursive: true });
await esbuild.build({
  entryPoints: { app: "src/main.ts" },
  bundle: true,
  minify: true,
  format: "esm",
  target: "es2020",
  outdir: "dist/assets",
  logLevel: "warning",
});
copyFileSync("src/index.html", "dist/index.html");
