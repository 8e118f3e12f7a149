// The files tab: browse directories, download a file, upload one into the directory shown.

import { json, request } from "./api";
import { bytes, h, message } from "./ui";

interface Entry {
  name: string;
  path: string;
  isDir: boolean;
  size: number;
}

export function filesTab(root: HTMLElement, sandboxId: string): () => void {
  let dir = "/home/user";
  const base = `/dashboard/api/sandboxes/${sandboxId}/files`;
  const pathInput = h("input", { type: "text", id: "files-path", value: dir, style: "width:24rem" }) as HTMLInputElement;
  const upload = h("input", { type: "file", id: "files-upload" }) as HTMLInputElement;
  const status = h("span", { role: "status", class: "muted", id: "files-status" });
  const listing = h("div", {});

  async function load(path: string): Promise<void> {
    dir = path.replace(/\/+$/, "") || "/";
    pathInput.value = dir;
    try {
      const entries = await json<Entry[]>("GET", `${base}?${new URLSearchParams({ path: dir })}`);
      const parent = dir === "/" ? null : dir.slice(0, dir.lastIndexOf("/")) || "/";
      listing.replaceChildren(
        h(
          "table",
          { id: "files-table" },
          h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Name"), h("th", { scope: "col" }, "Size"), h("th", { scope: "col" }, ""))),
          h(
            "tbody",
            {},
            parent !== null && h("tr", {}, h("td", {}, h("button", { type: "button", onclick: () => void load(parent) }, "..")), h("td", {}), h("td", {})),
            ...entries.map((e) =>
              h(
                "tr",
                {},
                h("td", {}, e.isDir ? h("button", { type: "button", onclick: () => void load(e.path) }, `${e.name}/`) : e.name),
                h("td", {}, e.isDir ? "" : bytes(e.size)),
                h("td", {}, e.isDir ? "" : h("a", { href: `${base}/content?${new URLSearchParams({ path: e.path })}`, download: e.name }, "Download")),
              ),
            ),
          ),
        ),
      );
    } catch (error) {
      listing.replaceChildren(message(`cannot list ${dir}: ${(error as Error).message}`, true));
    }
  }

  upload.addEventListener("change", async () => {
    const file = upload.files?.[0];
    if (!file) return;
    const target = `${dir === "/" ? "" : dir}/${file.name}`;
    status.textContent = `uploading ${file.name}…`;
    try {
      await request("PUT", `${base}/content?${new URLSearchParams({ path: target })}`, undefined, file);
      status.textContent = `uploaded ${target}`;
      await load(dir);
    } catch (error) {
      status.textContent = `upload failed: ${(error as Error).message}`;
    }
    upload.value = "";
  });

  root.replaceChildren(
    h(
      "form",
      { class: "toolbar", onsubmit: (e: Event) => { e.preventDefault(); void load(pathInput.value); } },
      h("label", { for: "files-path" }, "Directory"),
      pathInput,
      h("button", { type: "submit" }, "Open"),
      h("label", { for: "files-upload" }, "Upload a file here"),
      upload,
      status,
    ),
    listing,
  );
  void load(dir);
  return () => undefined;
}
